"""Every architecture against transformers on CPU float32: logits, prompt logprobs, greedy tokens, batching."""
from __future__ import annotations

import torch

from ember import LLM, SamplingParams
from ember.engine.scheduler import ScheduledSeq, SchedulerOutput

NUM_GREEDY = 64


def ember_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Full-sequence logits through the paged runner (one prefill of the whole prompt)."""
    runner = llm.engine.runner
    num_blocks = -(-len(ids) // runner.block_size)
    seq = ScheduledSeq("x", ids, 0, list(range(1, num_blocks + 1)), False, SamplingParams(), 0, ids, [], [])
    inputs = runner._prepare(SchedulerOutput([seq], len(ids), []))
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta)
        return runner.model.compute_logits(hidden).float()


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_logits_match_transformers(arch, hf_models):
    model_dir, hf = hf_models(arch)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False)
    ids = prompt(70, 1)  # longer than the mistral window (24) and several KV blocks
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = ember_logits(llm, ids)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4


def test_in_place_residual_adds_match_transformers(arch, hf_models, monkeypatch):
    """A step of more than ADD_IN_PLACE_MIN_ROWS tokens (64 here), where the o and down projections add into the
    residual stream in place (models without those biases) and each norm reads the stream alone."""
    from ember import ops
    from ember.layers import decoder

    monkeypatch.setattr(decoder, "ADD_IN_PLACE_MIN_ROWS", 64)
    model_dir, hf = hf_models(arch)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False)
    ids = prompt(150, 3)
    adds = []
    linear_add = ops.linear_add
    monkeypatch.setattr(ops, "linear_add", lambda x, *a: adds.append(x.shape[0]) or linear_add(x, *a))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = ember_logits(llm, ids)
    in_place = llm.engine.runner.model.model.layers[0].adds_in_place
    assert adds == ([len(ids)] * len(llm.engine.runner.model.model.layers) if in_place else [])
    assert (ours - ref).abs().max().item() <= 1e-4


def test_prompt_logprobs_and_greedy_match_transformers(arch, hf_models):
    model_dir, hf = hf_models(arch)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False)
    ids = prompt(33, 2)
    params = SamplingParams(max_tokens=NUM_GREEDY, temperature=0, prompt_logprobs=1, ignore_eos=True)
    out = llm.generate([ids], params)[0]
    with torch.no_grad():
        ref_lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert abs(entry[ids[pos]].logprob - ref_lp[pos - 1, ids[pos]].item()) <= 1e-4
        top_id = int(ref_lp[pos - 1].argmax())
        assert top_id in entry and abs(entry[top_id].logprob - ref_lp[pos - 1, top_id].item()) <= 1e-4
    assert out.outputs[0].token_ids == hf_greedy(hf, ids, NUM_GREEDY)
    assert out.outputs[0].finish_reason == "length"


def test_prompt_logprobs_in_slices_match_transformers(hf_models, monkeypatch):
    """Prompt logprobs computed a few logits rows at a time (a 16k-token chunk would otherwise hold 10 GB of float32
    logits at once) give the reference's values at every position."""
    from ember.worker import model_runner

    monkeypatch.setattr(model_runner, "PROMPT_LOGPROBS_ROWS", 5)
    model_dir, hf = hf_models("qwen3")
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False)
    ids = prompt(33, 2)
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))[0]
    with torch.no_grad():
        ref_lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    assert len(out.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert abs(entry[ids[pos]].logprob - ref_lp[pos - 1, ids[pos]].item()) <= 1e-4
        assert set(ref_lp[pos - 1].topk(2).indices.tolist()) <= set(entry)


def test_batched_equals_solo(arch, hf_models):
    model_dir, _ = hf_models(arch)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False, enable_prefix_caching=False)
    prompts = [prompt(n, 10 + n) for n in (5, 17, 40, 64)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    solo = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert batched == solo


def test_chunked_prefill_equals_whole(hf_models):
    model_dir, hf = hf_models("qwen3")
    ids = prompt(150, 3)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    chunked = LLM(str(model_dir), dtype="float32", device="cpu", progress=False, max_num_batched_tokens=32)
    assert chunked.generate([ids], params)[0].outputs[0].token_ids == hf_greedy(hf, ids, 16)


def test_seeded_sampling_is_reproducible_and_batch_independent(hf_models):
    model_dir, _ = hf_models("llama-gqa")
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False)
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    alone = llm.generate([prompt(12, 4)], params)[0].outputs[0].token_ids
    mixed = llm.generate([prompt(30, 5), prompt(12, 4), prompt(8, 6)], [params.replace(seed=1), params,
                                                                         params.replace(seed=2)])
    assert mixed[1].outputs[0].token_ids == alone
    assert mixed[0].outputs[0].token_ids != alone
