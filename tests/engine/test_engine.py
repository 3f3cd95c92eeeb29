"""End-to-end engine behaviour on real (tiny) models: caching paths equal cold runs, stops, n, logprobs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def qwen3(hf_models):
    return str(hf_models("qwen3")[0])


def test_prefix_hit_equals_cold_run(qwen3):
    shared = prompt(100, 1)
    a, b = shared + prompt(7, 2), shared + prompt(9, 3)
    cold = LLM(qwen3, dtype="float32", progress=False, enable_prefix_caching=False)
    warm = LLM(qwen3, dtype="float32", progress=False)
    first = warm.generate([a], GREEDY)[0]
    assert first.num_cached_tokens == 0
    second = warm.generate([b], GREEDY)[0]
    assert second.num_cached_tokens == 96  # 6 full blocks of 16 from the shared prefix
    assert second.outputs[0].token_ids == cold.generate([b], GREEDY)[0].outputs[0].token_ids
    # an identical prompt hits everything but the last block, and still samples the same tokens
    again = warm.generate([a], GREEDY)[0]
    assert again.num_cached_tokens == 96 and again.outputs[0].token_ids == first.outputs[0].token_ids


def test_small_pool_eviction_and_preemption_keep_results(qwen3):
    prompts = [prompt(40 + i, 10 + i) for i in range(6)]
    ref = [o.outputs[0].token_ids for o in LLM(qwen3, dtype="float32", progress=False).generate(prompts, GREEDY)]
    # 96 KV blocks-worth of bytes at most: forces preemption and cache eviction while 6 requests run
    tiny = LLM(qwen3, dtype="float32", progress=False, kv_cache_gb=14 * 16 * 3 * 2 * 2 * 24 * 4 / 2**30)
    assert tiny.engine.kv.pool.num_blocks == 14
    got = [o.outputs[0].token_ids for o in tiny.generate(prompts, GREEDY)]
    assert got == ref
    assert tiny.engine.kv.pool.num_used_blocks == 0


def test_request_that_can_never_fit_is_rejected(qwen3):
    llm = LLM(qwen3, dtype="float32", progress=False, kv_cache_gb=4 * 16 * 3 * 2 * 2 * 24 * 4 / 2**30)
    with pytest.raises(ValueError, match="can never fit the KV pool"):
        llm.generate([prompt(40, 1)], SamplingParams(max_tokens=40))


def test_stop_strings_token_ids_and_n(demo_dir):
    llm = LLM(str(demo_dir), progress=False)
    base = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    text = base.outputs[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=30, temperature=0, stop=stop, ignore_eos=True))[0]
    assert cut.outputs[0].text == text[: text.index(stop)]
    assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].stop_reason == stop
    kept = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=30, temperature=0, stop=stop,
                                                                 include_stop_str_in_output=True, ignore_eos=True))[0]
    assert kept.outputs[0].text == text[: text.index(stop) + len(stop)]
    tok = base.outputs[0].token_ids[5]
    by_id = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[tok],
                                                                  ignore_eos=True))[0]
    assert by_id.outputs[0].token_ids == base.outputs[0].token_ids[: base.outputs[0].token_ids.index(tok) + 1]
    many = llm.generate(["Hello"], SamplingParams(n=3, max_tokens=8, seed=3, temperature=1.0))[0]
    assert len(many.outputs) == 3 and len({tuple(o.token_ids) for o in many.outputs}) > 1


def test_logprobs_are_consistent(demo_dir):
    llm = LLM(str(demo_dir), progress=False)
    out = llm.generate(["Hello world"], SamplingParams(max_tokens=6, temperature=0, logprobs=3, ignore_eos=True))[0]
    comp = out.outputs[0]
    assert len(comp.logprobs) == 6
    for token, entry in zip(comp.token_ids, comp.logprobs):
        values = list(entry.values())
        assert next(iter(entry)) == token and entry[token].rank == 1  # greedy picks the top token
        assert len(entry) == 3 and all(v.logprob <= 0 for v in values)


def test_bad_requests_raise_and_leave_nothing_queued(demo_dir):
    llm = LLM(str(demo_dir), progress=False, max_model_len=64)
    with pytest.raises(ValueError, match="context window"):
        llm.generate([list(range(10, 80))], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="max_tokens=60"):
        llm.generate(["hi", list(range(10, 20))], SamplingParams(max_tokens=60))
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[10**7]], SamplingParams())
    with pytest.raises(TypeError, match="element 1 is 2.5"):
        llm.generate([[10, 11], [10, 2.5]], SamplingParams())
    assert not llm.engine.has_unfinished()
    # numpy integers are token ids too, and come back as Python ints
    (out,) = llm.generate([list(np.arange(10, 13))], SamplingParams(max_tokens=2, temperature=0))
    assert out.prompt_token_ids == [10, 11, 12] and all(type(t) is int for t in out.prompt_token_ids)


def test_generate_freezes_the_gc_heap_only_while_it_runs(demo_dir):
    """The heap is out of the cyclic GC's reach during generate (a full collection mid-run walks none of it) and
    back afterwards, so a dropped LLM can still be collected. An earlier freeze by someone else must not keep
    generate from freezing what came after it: on the H200 something had frozen 375 objects before the run, and a
    full collection walked the other ~245,000 for 90-200 ms mid-decode."""
    import gc

    llm = LLM(str(demo_dir), progress=False)
    walks = []  # what a full collection would walk at each step
    step = llm.engine.step

    def spy():
        walks.append(len(gc.get_objects(2)))
        return step()

    llm.engine.step = spy
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    gc.unfreeze()  # from a known state: on the H200 image something had frozen 375 objects by now
    llm.generate([[5, 6, 7]], params)
    assert walks and max(walks) < 5000
    assert gc.get_freeze_count() == 0
    gc.freeze()  # someone else's freeze, then a heap that grew after it
    grown = [[] for _ in range(20000)]
    gc.collect()
    walks.clear()
    try:
        llm.generate([[5, 6, 7]], params)
        assert walks and max(walks) < 5000, "the heap grown after an earlier freeze was walked"
        assert len(grown) == 20000
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_token_budget_defaults_by_device(demo_dir, monkeypatch):
    from types import SimpleNamespace

    from ember.config import default_max_num_batched_tokens

    llm = LLM(str(demo_dir), device="cpu", progress=False)
    assert llm.engine.sched_cfg.max_num_batched_tokens == 2048
    assert LLM(str(demo_dir), device="cpu", progress=False,
               max_num_batched_tokens=96).engine.sched_cfg.max_num_batched_tokens == 96
    gib = 2**30
    for total, offline, online in ((141 * gib, 32768, 8192), (80 * gib, 32768, 8192), (24 * gib, 8192, 2048)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _, t=total: SimpleNamespace(total_memory=t))
        assert default_max_num_batched_tokens(torch.device("cuda", 0)) == offline
        assert default_max_num_batched_tokens(torch.device("cuda", 0), online=True) == online


def test_a_token_budget_the_runner_fitted_reaches_the_scheduler(qwen3, monkeypatch):
    """Where the runner lowers a default token budget (its activations would crowd out the cache on a GPU;
    ModelRunner._fit_max_num_batched_tokens, tested in tests/worker/test_cache_budget.py), the scheduler plans
    with the lowered one; a budget the user gave is never handed to the fit."""
    from ember.worker.model_runner import ModelRunner

    def fit(self, budget):
        self.cache_cfg.max_num_batched_tokens = 24
        return budget

    monkeypatch.setattr(ModelRunner, "_fit_max_num_batched_tokens", fit)
    prompts = [list(range(3, 40)), [11] * 30]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    fitted = LLM(str(qwen3), device="cpu", progress=False)
    assert fitted.engine.sched_cfg.max_num_batched_tokens == fitted.engine.cache_cfg.max_num_batched_tokens == 24
    step_tokens = []
    launch = fitted.engine.runner.launch
    fitted.engine.runner.launch = lambda out: step_tokens.append(sum(len(s.token_ids) for s in out.seqs)) or launch(out)
    got = [o.outputs[0].token_ids for o in fitted.generate(prompts, params)]
    assert max(step_tokens) == 24 and len(step_tokens) > 4  # the 67 prompt tokens took 24-token chunks
    given = LLM(str(qwen3), device="cpu", progress=False, max_num_batched_tokens=96)
    assert given.engine.sched_cfg.max_num_batched_tokens == 96
    assert [o.outputs[0].token_ids for o in given.generate(prompts, params)] == got


def test_warm_up_leaves_pool_state_and_outputs_as_before(qwen3):
    """The start-up warm-up (run by itself on CUDA) writes KV only into the scratch block 0 and keeps no sampled
    ids: what follows generates as in a fresh engine."""
    model_dir = qwen3
    prompts = [[5, 9, 2, 7] * 5, list(range(3, 40)), [11] * 3]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    cold = LLM(str(model_dir), device="cpu", progress=False, max_num_batched_tokens=48, max_num_seqs=20)
    expected = [o.outputs[0].token_ids for o in cold.generate(prompts, params)]

    llm = LLM(str(model_dir), device="cpu", progress=False, max_num_batched_tokens=48, max_num_seqs=20)
    runner = llm.engine.runner
    launched = []
    launch = runner._launch_eager  # eager: a GPU's mixed-step graphs would take steps this small
    runner._launch_eager = lambda out: launched.append([len(s.token_ids) for s in out.seqs]) or launch(out)
    runner.warm_up()
    del runner._launch_eager
    assert launched == [[1] * 16 + [32]], "one mixed step: 16 one-token sequences and a prompt of the rest"
    assert all(cache[:, 1:].abs().sum() == 0 for cache in runner.kv_caches if cache is not None)
    assert any(cache[:, 0].abs().sum() > 0 for cache in runner.kv_caches if cache is not None)
    assert runner._last_token_ids is None
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected


def test_max_num_seqs_default_by_device_and_fitted_to_memory(demo_dir, hybrid_models):
    """By default 256 sequences on a GPU, 64 on CPU; a default gives way (halving) where a hybrid's recurrent state
    slots would take over a quarter of the cache budget, with the state slots following; a value the user gave
    is kept. The fitted engine still generates what an unconstrained one does."""
    from ember.config import default_max_num_seqs
    from ember.kv.spec import state_bytes_per_slot

    assert default_max_num_seqs(torch.device("cuda", 0)) == 256
    assert default_max_num_seqs(torch.device("cpu")) == 64
    assert LLM(str(demo_dir), device="cpu", progress=False).engine.sched_cfg.max_num_seqs == 64

    model_dir, _ = hybrid_models("qwen3_5")
    roomy = LLM(str(model_dir), device="cpu", progress=False, max_num_seqs=4)
    per_slot = state_bytes_per_slot(roomy.engine.runner.cache_specs, roomy.engine.runner.dtype)
    # 32 sequences' slots (2 each, prefix caching on, + the scratch slot) just fit in a quarter; 64's do not
    budget_gb = 1.01 * 4 * per_slot * (2 * 32 + 1) / 2**30
    fitted = LLM(str(model_dir), device="cpu", progress=False, kv_cache_gb=budget_gb)
    e = fitted.engine
    assert e.sched_cfg.max_num_seqs == e.cache_cfg.max_num_seqs == 32
    assert e.cache_cfg.num_state_slots == 64 and e.runner.state_cache.num_slots == 64
    given = LLM(str(model_dir), device="cpu", progress=False, kv_cache_gb=budget_gb, max_num_seqs=64)
    assert given.engine.sched_cfg.max_num_seqs == 64 and given.engine.runner.state_cache.num_slots == 128

    prompts = [[3 + i, 7, 11 + i, 2] * (3 + i) for i in range(40)]  # more requests than the fitted limit
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in fitted.generate(prompts, params)] == expected
