"""Logit bias, min_tokens bans and penalties against small python references."""

import math

import torch

from ember.sample.metadata import SamplingMetadata, SamplingRow
from ember.sample.sampler import Sampler
from ember.sampling_params import SamplingParams

VOCAB = 12
EOS = 11


def _row(params: SamplingParams, prompt=(), output=(), bans=(EOS,), seed: int = 0) -> SamplingRow:
    return SamplingRow(params, seed, len(output), list(prompt), list(output), list(bans))


def _process(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    return Sampler.process_logits(logits, SamplingMetadata.build(rows, VOCAB, "cpu"))


def _penalised_reference(logits: list[float], row: SamplingRow) -> list[float]:
    p = row.params
    out = list(logits)
    seen = set(row.prompt_token_ids) | set(row.output_token_ids)
    for token in range(VOCAB):
        if token in seen:
            x = out[token]
            out[token] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        count = list(row.output_token_ids).count(token)
        out[token] -= p.presence_penalty * (count > 0) + p.frequency_penalty * count
    return out


def test_plain_batch_builds_no_optional_tensors() -> None:
    rows = [_row(SamplingParams()), _row(SamplingParams(temperature=0.0, top_p=0.5))]
    meta = SamplingMetadata.build(rows, VOCAB, "cpu")
    assert meta.top_k is None and meta.top_p is None and meta.min_p is None
    assert meta.penalties is None and meta.logit_bias is None and meta.min_tokens_bans is None
    assert meta.max_num_logprobs is None
    assert not meta.all_greedy and not meta.all_random
    assert meta.temperature.tolist() == [1.0, 1.0]  # greedy rows never divide by zero


def test_penalties_match_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=gen) * 3
    rows = [
        _row(SamplingParams(repetition_penalty=1.5), prompt=[1, 2, 2], output=[3, 3, 4]),
        _row(SamplingParams(presence_penalty=0.7, frequency_penalty=0.4), prompt=[5], output=[6, 6, 6, 7]),
        _row(SamplingParams(repetition_penalty=0.8, presence_penalty=-1.0, frequency_penalty=2.0),
             prompt=[0, 9], output=[9, 10, 10]),
        _row(SamplingParams(), prompt=[1, 2], output=[1]),  # no penalties: unchanged
    ]
    processed = _process(logits, rows)
    for i, row in enumerate(rows):
        expected = _penalised_reference(logits[i].tolist(), row)
        torch.testing.assert_close(processed[i], torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_presence_and_frequency_ignore_prompt_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    rows = [_row(SamplingParams(presence_penalty=1.0, frequency_penalty=1.0), prompt=[2, 2, 2], output=[])]
    assert torch.equal(_process(logits, rows), logits)


def test_logit_bias_is_added_per_row() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [
        _row(SamplingParams(logit_bias={0: 100.0, 5: -2.5})),
        _row(SamplingParams()),
        _row(SamplingParams(logit_bias={5: 1.0})),
    ]
    expected = logits.clone()
    expected[0, 0] += 100.0
    expected[0, 5] -= 2.5
    expected[2, 5] += 1.0
    assert torch.equal(_process(logits, rows), expected)
    greedy = [_row(SamplingParams(temperature=0.0, logit_bias={7: 100.0}))]
    meta = SamplingMetadata.build(greedy, VOCAB, "cpu")
    assert Sampler()(logits[:1], meta).sampled_token_ids.tolist() == [7]


def test_min_tokens_bans_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS] = 50.0  # eos would always win
    params = SamplingParams(min_tokens=3, temperature=0.0)
    for step in range(5):
        row = _row(params, output=[1] * step, bans=[EOS, 4])
        processed = _process(logits, [row])
        is_banned = step < 3
        assert math.isinf(processed[0, EOS].item()) == is_banned
        assert math.isinf(processed[0, 4].item()) == is_banned
        token = Sampler()(logits, SamplingMetadata.build([row], VOCAB, "cpu")).sampled_token_ids.item()
        assert (token != EOS) == is_banned


def test_min_tokens_bans_hold_for_random_rows() -> None:
    logits = torch.zeros(200, VOCAB)
    logits[:, EOS] = 5.0
    rows = [_row(SamplingParams(min_tokens=2), output=[1], seed=s) for s in range(200)]
    tokens = Sampler()(logits, SamplingMetadata.build(rows, VOCAB, "cpu")).sampled_token_ids
    assert not (tokens == EOS).any()
