"""CUDA-only checks: no host syncs in the sampler, and the same tokens as on CPU."""

import pytest
import torch

from ember.sample.metadata import SamplingMetadata, SamplingRow
from ember.sample.sampler import Sampler
from ember.sampling_params import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

VOCAB = 32_000


def _rows() -> list[SamplingRow]:
    params = [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(),
        SamplingParams(temperature=0.6, top_k=40),
        SamplingParams(top_p=0.9),
        SamplingParams(min_p=0.05, temperature=1.3),
        SamplingParams(repetition_penalty=1.2, presence_penalty=0.4, frequency_penalty=0.3),
        SamplingParams(logit_bias={5: 3.0}, top_k=100, top_p=0.95, min_tokens=8, max_tokens=None),
    ]
    return [SamplingRow(p, 1000 + i, 3, [i, 50, 51], [7, 7, i], [0, 2]) for i, p in enumerate(params)]


def test_sampler_has_no_host_syncs() -> None:
    logits = torch.randn(7, VOCAB, device="cuda")
    meta = SamplingMetadata.build(_rows(), VOCAB, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = Sampler()(logits, meta)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.sampled_token_ids.shape == (7,)


def test_cuda_samples_match_cpu() -> None:
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler()
    for _ in range(20):
        logits = torch.randn(7, VOCAB, generator=gen) * 3
        cpu = sampler(logits, SamplingMetadata.build(_rows(), VOCAB, "cpu"))
        cuda = sampler(logits.cuda(), SamplingMetadata.build(_rows(), VOCAB, "cuda"))
        assert torch.equal(cuda.sampled_token_ids.cpu(), cpu.sampled_token_ids)
