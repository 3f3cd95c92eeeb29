"""Hybrid models (Gated DeltaNet state slots, sliding-window KV groups, shared KV) on CUDA against the CPU float32
path: the same greedy tokens and logprobs, cold and from a prefix-cache hit that restores recurrent state."""
from __future__ import annotations

import pytest
import torch

from ember import LLM, SamplingParams
from tests.parity.hybrid_models import build_hybrid_model
from tests.parity.models import build_hf_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(llm: LLM, prompts: list[list[int]]):
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4", "gemma4-k-eq-v", "mistral-window"])
def test_cuda_float32_matches_cpu(name, tmp_path):
    (build_hf_model if name == "mistral-window" else build_hybrid_model)(name, tmp_path)
    g = torch.Generator().manual_seed(0)
    base = torch.randint(3, 500, (70,), generator=g).tolist()
    prompts = [base, base[:37], base + [5, 6, 7]]  # the last two hit the first's cached prefix
    cpu = LLM(str(tmp_path), dtype="float32", device="cpu", progress=False)
    gpu = LLM(str(tmp_path), dtype="float32", device="cuda", progress=False, kv_cache_gb=1)
    ref = [_run(cpu, [p])[0] for p in prompts]
    ours = [_run(gpu, [p])[0] for p in prompts]
    for a, b in zip(ours, ref):
        assert a.token_ids == b.token_ids
        for row_a, row_b, t in zip(a.logprobs, b.logprobs, a.token_ids):
            assert abs(row_a[t].logprob - row_b[t].logprob) <= 1e-3
    assert [o.token_ids for o in _run(gpu, prompts)] == [o.token_ids for o in ref]  # batched
