"""Hybrid architectures (Gated DeltaNet, sliding window, shared KV) against transformers on CPU float32: logits,
greedy tokens, batching, chunked prefill, and prefix-cache hits that must equal a cold run."""
from __future__ import annotations

import pytest
import torch

from ember import LLM, SamplingParams
from ember.engine.scheduler import ScheduledSeq, SchedulerOutput
from ember.kv.state_pool import StateStep
from tests.parity.hybrid_models import HYBRID_CONFIGS, build_multimodal_model

NUM_GREEDY = 64
TOL = 1e-4


@pytest.fixture(params=sorted(HYBRID_CONFIGS))
def hybrid(request, hybrid_models):
    return hybrid_models(request.param)


def make_llm(model_dir, **kwargs) -> LLM:
    return LLM(str(model_dir), dtype="float32", device="cpu", progress=False, **kwargs)


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def ember_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Full-sequence logits through the paged runner (one prefill of the whole prompt, fresh state slot 0)."""
    runner = llm.engine.runner
    blocks = list(range(1, -(-len(ids) // runner.block_size) + 1))
    state = StateStep(-1, 0) if runner.state_cache.layers else None
    groups = [blocks for _ in runner.kv_groups[1:]] or None  # sliding windows' own block tables
    seq = ScheduledSeq("x", ids, 0, blocks, False, SamplingParams(), 0, ids, [], [], state, groups)
    inputs = runner._prepare(SchedulerOutput([seq], len(ids), []))
    with torch.inference_mode():
        return runner.model.compute_logits(runner.model(inputs.input_ids, inputs.positions, inputs.meta)).float()


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    return hf_greedy_logprobs(hf, ids, n)[0]


def hf_greedy_logprobs(hf, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the logprobs of each step ([n, vocab]), from its own decode path."""
    out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                      output_logits=True, return_dict_in_generate=True)
    logprobs = torch.log_softmax(torch.cat(out.logits).float(), -1)
    return out.sequences[0, len(ids):].tolist(), logprobs


def greedy(llm: LLM, prompts: list[list[int]], n: int, logprobs: int | None = None):
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=logprobs)
    return llm.generate(prompts, params)


def assert_same_logprobs(a, b) -> None:
    """Per generated position, the same top tokens with logprobs within TOL."""
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b):
        assert row_a.keys() == row_b.keys()
        for token, lp in row_a.items():
            assert abs(lp.logprob - row_b[token].logprob) <= TOL


def test_logits_match_transformers(hybrid):
    model_dir, hf = hybrid
    ids = prompt(150, 1)  # several delta-rule chunks (64), KV blocks and sliding windows
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = ember_logits(make_llm(model_dir), ids)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= TOL


def test_greedy_matches_transformers(hybrid):
    """64 greedy tokens, and every step's logprob equals transformers' (its decode path, step by step)."""
    model_dir, hf = hybrid
    ids = prompt(33, 2)
    out = greedy(make_llm(model_dir, enable_prefix_caching=False), [ids], NUM_GREEDY, logprobs=0)[0].outputs[0]
    ref_tokens, ref = hf_greedy_logprobs(hf, ids, NUM_GREEDY)
    assert out.token_ids == ref_tokens
    for i, (token, row) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(row[token].logprob - ref[i, token].item()) <= TOL


def test_batched_equals_solo(hybrid):
    model_dir, _ = hybrid
    llm = make_llm(model_dir, enable_prefix_caching=False)
    prompts = [prompt(n, 10 + n) for n in (1, 5, 17, 40, 70)]
    batched = [o.outputs[0].token_ids for o in greedy(llm, prompts, 24)]
    solo = [greedy(llm, [p], 24)[0].outputs[0].token_ids for p in prompts]
    assert batched == solo


def test_chunked_prefill_matches_transformers(hybrid):
    model_dir, hf = hybrid
    ids = prompt(150, 3)
    llm = make_llm(model_dir, max_num_batched_tokens=37, enable_prefix_caching=False)  # chunks end mid-block
    assert greedy(llm, [ids], 16)[0].outputs[0].token_ids == hf_greedy(hf, ids, 16)


def test_prefix_hit_equals_cold_run(hybrid):
    """A repeated prompt and a follow-up turn resume from cached KV and restored recurrent state."""
    model_dir, _ = hybrid
    cold = make_llm(model_dir, enable_prefix_caching=False)
    warm = make_llm(model_dir)
    first = prompt(53, 4)
    out1 = greedy(warm, [first], 40, logprobs=3)[0]
    again = greedy(warm, [first], 40, logprobs=3)[0]
    assert again.num_cached_tokens == 48  # the last block boundary of the prompt
    ref = greedy(cold, [first], 40, logprobs=3)[0]
    assert again.outputs[0].token_ids == ref.outputs[0].token_ids == out1.outputs[0].token_ids
    assert_same_logprobs(again.outputs[0].logprobs, ref.outputs[0].logprobs)
    # next turn: the conversation so far plus new tokens; resumes inside the generated part
    turn2 = first + out1.outputs[0].token_ids[:-1] + prompt(9, 5)
    hit = greedy(warm, [turn2], 24, logprobs=3)[0]
    assert hit.num_cached_tokens >= 80
    ref2 = greedy(cold, [turn2], 24, logprobs=3)[0]
    assert hit.outputs[0].token_ids == ref2.outputs[0].token_ids
    assert_same_logprobs(hit.outputs[0].logprobs, ref2.outputs[0].logprobs)


def test_prefix_hit_after_chunked_prefill(hybrid):
    """A prompt sharing part of a chunked-prefill prompt: attention-only models reuse every shared full block;
    recurrent ones resume at the last snapshot inside it (chunks end at 40, 80: snapshots at 32, 80)."""
    model_dir, hf = hybrid
    llm = make_llm(model_dir, max_num_batched_tokens=40)
    ids = prompt(100, 6)
    greedy(llm, [ids], 4)
    shorter = ids[:70] + prompt(10, 7)
    out = greedy(llm, [shorter], 16)[0]
    assert out.num_cached_tokens == (32 if llm.engine.runner.state_cache.layers else 64)
    assert out.outputs[0].token_ids == hf_greedy(hf, shorter, 16)


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_multimodal_checkpoint_loads_language_model(name, tmp_path):
    hf = build_multimodal_model(name, tmp_path)
    ids = prompt(40, 8)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0].float()
    assert (ember_logits(make_llm(tmp_path), ids) - ref).abs().max().item() <= TOL


def test_sliding_window_layers_hold_only_their_window(hybrid_models):
    """Gemma 4's sliding layers keep their own small pool and release blocks that leave the window; the global
    layers' pool (sized by what is left) holds the whole sequence. Tokens still match transformers."""
    model_dir, hf = hybrid_models("gemma4")
    llm = make_llm(model_dir, enable_prefix_caching=False)
    engine, runner = llm.engine, llm.engine.runner
    assert [g.window for g in runner.kv_groups] == [None, 20]
    assert runner.group_num_blocks[1] < runner.group_num_blocks[0]
    ids = prompt(70, 9)
    engine.add_request("r", ids, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    tokens, held = [], []
    while engine.has_unfinished():
        for delta in engine.step():
            tokens += delta.new_token_ids
        held.append((engine.kv.pool.num_used_blocks, engine.kv.groups[1].pool.num_used_blocks))
    assert tokens == hf_greedy(hf, ids, 40)
    full, sliding = zip(*held[:-1])  # the last step finished the request and freed everything
    assert max(full) == -(-(70 + 39) // 16) and max(sliding[1:]) <= 3  # 20-token window over 16-token blocks


@pytest.mark.parametrize("state_dtype", ["bfloat16", "float16"])
def test_half_precision_recurrent_state(hybrid_models, state_dtype):
    """ssm_state_dtype stores Gated DeltaNet's state matrix in half precision (the conv windows stay in the model
    dtype): half the state memory, updates still in float32, so greedy tokens match the float32-state run and
    transformers, with logprobs close to them. Unknown names are refused with the allowed ones."""
    model_dir, hf = hybrid_models("qwen3_5")
    ids = prompt(100, 3)
    runs = {}
    for dtype in ("float32", state_dtype):
        llm = make_llm(model_dir, ssm_state_dtype=dtype, max_num_batched_tokens=37)  # states stored mid-prompt
        runner = llm.engine.runner
        layer = next(iter(runner.state_cache.layers.values()))
        assert layer["ssm"].dtype == getattr(torch, dtype) and layer["conv"].dtype == torch.float32
        runs[dtype] = (greedy(llm, [ids], 32, logprobs=3)[0].outputs[0], runner.state_bytes)
    (ref, ref_bytes), (half, half_bytes) = runs["float32"], runs[state_dtype]
    conv_bytes = sum(t["conv"].numel() * 4 for t in runner.state_cache.layers.values())
    assert half_bytes - conv_bytes == (ref_bytes - conv_bytes) // 2
    assert half.token_ids == ref.token_ids == hf_greedy(hf, ids, 32)
    worst = max(abs(half.logprobs[i][t].logprob - ref.logprobs[i][t].logprob) for i, t in enumerate(ref.token_ids))
    assert 0 < worst < 0.1  # rounded, so not bit-identical; bf16 measured ~0.05, fp16 ~0.002 on this model
    with pytest.raises(ValueError, match="ssm_state_dtype 'int8'.*supported: auto, bf16"):
        make_llm(model_dir, ssm_state_dtype="int8")
