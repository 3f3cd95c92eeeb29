"""Sampler behaviour: greedy, filters (support and distribution), logprobs, batch independence."""

import pytest
import torch

from ember.sample.metadata import SamplingMetadata, SamplingRow
from ember.sample.sampler import Sampler, compute_logprobs
from ember.sampling_params import SamplingParams

PROBS = torch.tensor([0.3, 0.22, 0.15, 0.12, 0.09, 0.06, 0.04, 0.02])
LOGITS = PROBS.log() + 1.7  # an offset: the sampler must not assume normalised logits
NUM_DRAWS = 20_000


def _row(params: SamplingParams, seed: int = 0, step: int = 0, prompt=(), output=None) -> SamplingRow:
    output = [0] * step if output is None else list(output)
    return SamplingRow(params, seed, len(output), list(prompt), output, [])


def _sample(logits: torch.Tensor, rows: list[SamplingRow]):
    return Sampler()(logits, SamplingMetadata.build(rows, logits.shape[-1], "cpu"))


def _draw_many(params: SamplingParams) -> torch.Tensor:
    rows = [_row(params, seed=seed, step=2) for seed in range(NUM_DRAWS)]
    return _sample(LOGITS.expand(NUM_DRAWS, -1), rows).sampled_token_ids


def _keep_top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    return torch.where(probs >= probs.sort(descending=True).values[k - 1], probs, 0.0)


def _keep_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    probs = probs / probs.sum()
    ordered, order = probs.sort(descending=True)
    mass_before = ordered.cumsum(0) - ordered
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order] = mass_before < p
    return torch.where(keep, probs, 0.0)


def _keep_min_p(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = probs / probs.sum()
    return torch.where(probs >= min_p * probs.max(), probs, 0.0)


def _case_id(params: SamplingParams) -> str:
    defaults = SamplingParams()
    changed = [f"{k}={getattr(params, k)}" for k in ("temperature", "top_k", "top_p", "min_p")
               if getattr(params, k) != getattr(defaults, k)]
    return ",".join(changed) or "plain"


_FILTER_CASES = [
    (SamplingParams(), PROBS),
    (SamplingParams(temperature=0.5), PROBS**2),
    (SamplingParams(temperature=2.0), PROBS**0.5),
    (SamplingParams(top_k=3), _keep_top_k(PROBS, 3)),
    (SamplingParams(top_p=0.6), _keep_top_p(PROBS, 0.6)),
    (SamplingParams(top_p=0.7), _keep_top_p(PROBS, 0.7)),
    (SamplingParams(min_p=0.25), _keep_min_p(PROBS, 0.25)),
    (SamplingParams(top_k=4, top_p=0.8), _keep_top_p(_keep_top_k(PROBS, 4), 0.8)),
    (SamplingParams(temperature=0.7, top_k=6, top_p=0.9, min_p=0.1),
     _keep_min_p(_keep_top_p(_keep_top_k(PROBS ** (1 / 0.7), 6), 0.9), 0.1)),
]
FILTER_CASES = [pytest.param(p, e, id=_case_id(p)) for p, e in _FILTER_CASES]


@pytest.mark.parametrize(("params", "expected"), FILTER_CASES)
def test_filters_restrict_support_and_match_distribution(params, expected, assert_distribution) -> None:
    expected = expected / expected.sum()
    assert_distribution(_draw_many(params), expected)


def test_filter_references_keep_the_intended_tokens() -> None:
    # Guards the references themselves: these supports are worked out by hand.
    assert (_keep_top_p(PROBS, 0.6) > 0).sum() == 3  # mass before 4th = 0.67
    assert (_keep_top_p(PROBS, 0.7) > 0).sum() == 4
    assert (_keep_min_p(PROBS, 0.25) > 0).sum() == 5  # threshold 0.075
    assert (_keep_top_p(_keep_top_k(PROBS, 4), 0.8) > 0).sum() == 3


def test_top_p_keeps_the_top_token_even_when_tiny() -> None:
    logits = torch.tensor([[0.0, 0.0, 5.0, 0.0]]).expand(50, -1)
    rows = [_row(SamplingParams(top_p=1e-6), seed=s) for s in range(50)]
    assert (_sample(logits, rows).sampled_token_ids == 2).all()


def test_greedy_equals_argmax() -> None:
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(0))
    rows = [_row(SamplingParams(temperature=0.0), seed=s) for s in range(16)]
    assert torch.equal(_sample(logits, rows).sampled_token_ids, logits.argmax(-1))
    mixed = [_row(SamplingParams(temperature=0.0 if s % 2 else 1.3, top_k=1), seed=s) for s in range(16)]
    assert torch.equal(_sample(logits, mixed).sampled_token_ids, logits.argmax(-1))


def test_logprobs_match_log_softmax_of_raw_logits() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2)) * 2
    rows = [
        _row(SamplingParams(logprobs=0)),
        _row(SamplingParams(logprobs=5, repetition_penalty=2.0), prompt=[1, 2], seed=1),
        _row(SamplingParams(temperature=0.0, logit_bias={3: 30.0}, logprobs=2)),
        _row(SamplingParams(), seed=3),
    ]
    out = _sample(logits, rows)
    assert out.logprobs is not None
    reference = torch.log_softmax(logits, dim=-1)  # raw: before bias and penalties
    sampled = out.sampled_token_ids
    assert out.logprobs.token_ids.shape == (4, 6) and out.logprobs.logprobs.shape == (4, 6)
    assert torch.equal(out.logprobs.token_ids[:, 0], sampled)
    torch.testing.assert_close(out.logprobs.logprobs[:, 0], reference.gather(1, sampled[:, None])[:, 0])
    top_values, top_ids = reference.topk(5, dim=-1)
    assert torch.equal(out.logprobs.token_ids[:, 1:], top_ids)
    torch.testing.assert_close(out.logprobs.logprobs[:, 1:], top_values)
    order = reference.argsort(dim=-1, descending=True)
    expected_ranks = (order == sampled[:, None]).int().argmax(-1) + 1
    assert torch.equal(out.logprobs.ranks, expected_ranks)
    assert sampled[2].item() == 3 and out.logprobs.ranks[2].item() > 1  # biased, ranked on raw


def test_compute_logprobs_for_given_tokens() -> None:
    logits = torch.randn(7, 30, generator=torch.Generator().manual_seed(3))
    token_ids = torch.tensor([0, 5, 29, 3, 3, 1, 2])
    result = compute_logprobs(logits, token_ids, k=2)
    reference = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(result.logprobs[:, 0], reference[torch.arange(7), token_ids])
    assert torch.equal(result.token_ids[:, 1:], reference.topk(2, dim=-1).indices)
    top1 = reference.argmax(-1)
    assert torch.equal(compute_logprobs(logits, top1, k=0).ranks, torch.ones(7, dtype=torch.int64))
    assert compute_logprobs(logits, top1, k=0).token_ids.shape == (7, 1)


def _mixed_rows(seed_base: int, step: int) -> list[SamplingRow]:
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(),
        SamplingParams(temperature=0.6, top_k=20),
        SamplingParams(top_p=0.8, logprobs=3),
        SamplingParams(min_p=0.05, temperature=1.4),
        SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
        SamplingParams(logit_bias={3: 4.0, 9: -5.0}, top_k=50, top_p=0.95),
        SamplingParams(temperature=0.9, min_tokens=100, max_tokens=None, logprobs=1),
    ]
    return [
        SamplingRow(p, seed_base + i, step, [i, 2 * i, 7], [i + 1] * step, [0, 1])
        for i, p in enumerate(params)
    ]


def test_row_sample_is_independent_of_the_batch() -> None:
    gen = torch.Generator().manual_seed(4)
    for trial in range(25):
        logits = torch.randn(8, 300, generator=gen) * 2
        rows = _mixed_rows(seed_base=trial * 10, step=trial % 4)
        alone = torch.cat([_sample(logits[i : i + 1], [rows[i]]).sampled_token_ids for i in range(8)])
        perm = torch.randperm(8, generator=gen)
        batched = _sample(logits[perm], [rows[i] for i in perm.tolist()])
        assert torch.equal(batched.sampled_token_ids, alone[perm])
        assert batched.logprobs is not None and batched.logprobs.token_ids.shape[1] == 4


def test_same_seed_and_step_repeat_and_steps_advance() -> None:
    logits = torch.zeros(1, 1000)  # uniform: any repeat across steps would be a coincidence
    draws = [_sample(logits, [_row(SamplingParams(), seed=5, step=s)]).sampled_token_ids.item() for s in range(20)]
    again = [_sample(logits, [_row(SamplingParams(), seed=5, step=s)]).sampled_token_ids.item() for s in range(20)]
    assert draws == again
    assert len(set(draws)) >= 18
