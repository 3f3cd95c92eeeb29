"""out_rows (ember/layers/decoder.py): a step that samples from a few rows runs its last layer's MLP and the final
norm on those rows alone. Every architecture: the selected rows' logits equal the same rows of the full forward,
every token's K and V (and recurrent state) are still written, a step with no rows to sample writes them too, and
the engine's prefill steps take the path (its output is held to transformers by the other parity tests). Gemma 4's
trailing KV-shared layers run on the sampled rows alone, as a decode step's queries, in the engine's eager steps."""
from __future__ import annotations

import pytest
import torch

from ember import LLM, SamplingParams
from ember.engine.scheduler import ScheduledSeq, SchedulerOutput
from ember.kv.state_pool import StateStep
from tests.parity.hybrid_models import HYBRID_CONFIGS
from tests.parity.models import CONFIGS

ROWS = [69, 0, 41, 68]  # any order, as a step's sample rows come


def step(llm: LLM, ids: list[int], rows: list[int] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One prefill of ids (fresh KV blocks, fresh state slot 0): (logits of rows, or of every row where None;
    copies of every layer's cache)."""
    runner = llm.engine.runner
    blocks = list(range(1, -(-len(ids) // runner.block_size) + 1))
    state = StateStep(-1, 0) if runner.state_cache.layers else None
    groups = [blocks for _ in runner.kv_groups[1:]] or None
    seq = ScheduledSeq("x", ids, 0, blocks, False, SamplingParams(), 0, ids, [], [], state, groups)
    inputs = runner._prepare(SchedulerOutput([seq], len(ids), []))
    inputs.meta.sample_seq_idx = None  # rows other than a sampled sequence's last: no KV-shared layer runs them alone
    for t in caches(runner):  # nothing left from a run before
        t.zero_()
    out_rows = None if rows is None else torch.tensor(rows, dtype=torch.int64)
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta, out_rows)
        logits = runner.model.compute_logits(hidden).float() if len(hidden) else hidden
    return logits, [t.clone() for t in caches(runner)]


def caches(runner) -> list[torch.Tensor]:
    """Every layer's KV cache (shared layers' once) and recurrent state tensors."""
    kv = list({id(t): t for t in runner.kv_caches if t is not None}.values())
    return kv + [t for d in runner.state_cache.layers.values() for t in d.values()]


def last_mlp_rows(llm: LLM) -> list[int]:
    """A list that gets the row count of each input to the last layer's MLP (its gate/up projection, called or
    fused with the norm before it)."""
    rows: list[int] = []
    proj = llm.engine.runner.model.model.layers[-1].mlp.gate_up_proj
    proj.register_forward_pre_hook(lambda _, args: rows.append(args[0].shape[0]))
    normed = proj.forward_normed
    proj.forward_normed = lambda x, *a: rows.append(x.shape[0]) or normed(x, *a)
    return rows


@pytest.mark.parametrize("name", sorted(CONFIGS) + sorted(HYBRID_CONFIGS))
def test_out_rows_equal_those_rows_of_every_row(name, hf_models, hybrid_models, monkeypatch):
    """The Llama family twice: adding the residual stream after the norms and (steps of more than 32 tokens) into
    it in place."""
    from ember.layers import decoder

    model_dir, _ = (hf_models if name in CONFIGS else hybrid_models)(name)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False, kv_cache_gb=0.01)  # caches compared
    ids = torch.randint(3, 500, (70,), generator=torch.Generator().manual_seed(5)).tolist()
    mlp_rows = last_mlp_rows(llm)
    for in_place_min_rows in (decoder.ADD_IN_PLACE_MIN_ROWS, 32) if name in CONFIGS else (None,):
        monkeypatch.setattr(decoder, "ADD_IN_PLACE_MIN_ROWS", in_place_min_rows)
        full, full_cache = step(llm, ids, None)
        mlp_rows.clear()
        picked, cache = step(llm, ids, ROWS)
        assert mlp_rows == [len(ROWS)], "the last layer's MLP ran on more than the selected rows"
        assert picked.shape == (len(ROWS), full.shape[1])
        torch.testing.assert_close(picked, full[ROWS], rtol=1e-5, atol=1e-5)
        none, empty_cache = step(llm, ids, [])
        assert none.shape[0] == 0 and mlp_rows == [len(ROWS)], "a step with nothing to sample ran the last MLP"
        assert full_cache and len(cache) == len(full_cache) == len(empty_cache)
        for a, b, c in zip(full_cache, cache, empty_cache):
            assert torch.equal(a, b) and torch.equal(a, c)


def test_engine_prefill_runs_the_last_mlp_on_sampled_rows_alone(hf_models):
    """Steps through the engine: the last layer's MLP sees one row per sampled sequence of a prefill step, none in a
    chunk before a prompt's last, every row of a decode step, and every row of a step with prompt logprobs."""
    model_dir, _ = hf_models("qwen3")
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False, max_num_batched_tokens=64)
    rows = last_mlp_rows(llm)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    llm.generate([[5] * 20, [6] * 30], params)
    assert rows == [2, 2]  # one 50-token prefill step sampling two rows, one decode step of two rows
    rows.clear()
    llm.generate([[7] * 100], params)
    assert rows == [1, 1]  # 64 tokens (nothing sampled, no MLP), 36 tokens sampling one row, one decode step
    rows.clear()
    llm.generate([[8] * 20], SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert rows == [20]


def test_kv_shared_layers_run_on_sampled_rows_alone(hybrid_models):
    """Gemma 4's trailing KV-shared layers write no KV: in an eager step they run on the sampled rows alone, as a
    decode step's queries over the KV the layers before wrote (chunked prompts, sliding and global donors, a
    decode among prompt chunks). The same tokens and logprobs as with every row through them."""
    model_dir, _ = hybrid_models("gemma4")
    prompts = [torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (45, 9, 70)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=3)

    def run(skip: bool):
        llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False, max_num_batched_tokens=32)
        model = llm.engine.runner.model.model
        assert model.shared_from == 4
        if not skip:
            model.shared_from = None
        rows, expected = [], []

        def step_rows(_, args):  # (input_ids, positions, meta, out_rows)
            ids, _, meta, out_rows = args
            sampled = len(ids) if out_rows is None else len(out_rows)
            # layers 4 and 5: both on the sampled rows (none if nothing is sampled), else the last alone
            layer_rows = [sampled] * 2 if skip and out_rows is not None else [len(ids), sampled]
            expected.extend(n for n in layer_rows if n)

        model.register_forward_pre_hook(step_rows)
        for layer in model.layers[4:]:
            layer.mlp.gate_up_proj.register_forward_pre_hook(lambda _, args: rows.append(args[0].shape[0]))
        outs = [o.outputs[0] for o in llm.generate(prompts, params)]
        assert rows == expected
        return outs, rows

    (ours, rows), (ref, ref_rows) = run(True), run(False)
    assert sum(rows) < sum(ref_rows) / 4  # most rows of the steps are prompt tokens nothing samples from
    for a, b in zip(ours, ref):
        assert a.token_ids == b.token_ids
        for la, lb in zip(a.logprobs, b.logprobs):
            assert la.keys() == lb.keys()
            assert max(abs(la[t].logprob - lb[t].logprob) for t in la) < 1e-5
