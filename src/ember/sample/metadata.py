"""Per-step batch tensors for the sampler, built from one `SamplingRow` per request.

Optional features are `None` when no row in the batch uses them, so the common
greedy / plain-temperature batch does no extra work in the sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ember.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    """One request's sampling state at this step."""

    params: SamplingParams
    seed: int
    step: int  # == len(output_token_ids): the noise counter
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    stop_token_ids_for_min_tokens: Sequence[int]  # eos + stop ids, banned while step < min_tokens


@dataclass(slots=True)
class TokenBias:
    """Sparse additive logits update: logits[rows[i], cols[i]] += values[i]."""

    rows: torch.Tensor  # [N] int64
    cols: torch.Tensor  # [N] int64
    values: torch.Tensor  # [N] float32


@dataclass(slots=True)
class Penalties:
    """Repetition (prompt + output) and presence / frequency (output only) penalties."""

    output_token_counts: torch.Tensor  # [B, V] float32
    repetition: torch.Tensor | None  # [B] float32
    prompt_token_mask: torch.Tensor | None  # [B, V] bool, only with repetition
    presence: torch.Tensor | None  # [B] float32
    frequency: torch.Tensor | None  # [B] float32


@dataclass(slots=True)
class SamplingMetadata:
    temperature: torch.Tensor  # [B] float32; greedy rows hold 1.0 so nothing divides by 0
    is_greedy: torch.Tensor  # [B] bool
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None  # [B] int64, 0 = off
    max_top_k: int  # largest top_k in the batch, for a host-sync-free torch.topk
    top_p: torch.Tensor | None  # [B] float32
    min_p: torch.Tensor | None  # [B] float32
    penalties: Penalties | None
    logit_bias: TokenBias | None
    min_tokens_bans: TokenBias | None  # values are -inf
    max_num_logprobs: int | None
    seeds: torch.Tensor  # [B] int64
    steps: torch.Tensor  # [B] int64

    @classmethod
    def build(cls, rows: list[SamplingRow], vocab_size: int, device: torch.device | str) -> SamplingMetadata:
        """Gather the rows' parameters into device tensors for one sampler call."""
        assert rows, "SamplingMetadata.build needs at least one row"
        params = [row.params for row in rows]
        is_greedy = [p.is_greedy for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        top_ks = [min(p.top_k, vocab_size) for p in params]

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        def optional(values: list[float], neutral: float) -> torch.Tensor | None:
            # Greedy rows never use the random-only filters.
            used = any(v != neutral for v, g in zip(values, is_greedy) if not g)
            return column(values, torch.float32) if used else None

        return cls(
            temperature=column([1.0 if g else p.temperature for p, g in zip(params, is_greedy)], torch.float32),
            is_greedy=column(is_greedy, torch.bool),
            all_greedy=all(is_greedy),
            all_random=not any(is_greedy),
            top_k=column(top_ks, torch.int64) if any(k > 1 for k in top_ks) else None,
            max_top_k=max(top_ks),
            top_p=optional([p.top_p for p in params], 1.0),
            min_p=optional([p.min_p for p in params], 0.0),
            penalties=_build_penalties(rows, vocab_size, device),
            logit_bias=_build_logit_bias(rows, vocab_size, device),
            min_tokens_bans=_build_min_tokens_bans(rows, device),
            max_num_logprobs=max(logprobs) if logprobs else None,
            seeds=column([_to_int64(row.seed) for row in rows], torch.int64),
            steps=column([row.step for row in rows], torch.int64),
        )


def _to_int64(seed: int) -> int:
    # Seeds may be given as unsigned 64-bit; keep the same bits in a signed int64.
    return seed - 2**64 if seed >= 2**63 else seed


def _token_counts(
    token_ids: list[Sequence[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """Per-row token counts [B, V] float32, via scatter_add on the device."""
    width = max(1, max(len(ids) for ids in token_ids))
    # Pad with an extra column id `vocab_size` that is dropped after the scatter.
    padded = torch.full((len(token_ids), width), vocab_size, dtype=torch.int64)
    for i, ids in enumerate(token_ids):
        padded[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.int64)
    padded = padded.to(device)
    counts = torch.zeros(len(token_ids), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))
    return counts[:, :vocab_size]


def _build_penalties(rows: list[SamplingRow], vocab_size: int, device: torch.device | str) -> Penalties | None:
    params = [row.params for row in rows]
    repetition = [p.repetition_penalty for p in params]
    presence = [p.presence_penalty for p in params]
    frequency = [p.frequency_penalty for p in params]
    has_repetition = any(v != 1.0 for v in repetition)
    has_presence = any(v != 0.0 for v in presence)
    has_frequency = any(v != 0.0 for v in frequency)
    if not (has_repetition or has_presence or has_frequency):
        return None

    def column(values: list[float], used: bool) -> torch.Tensor | None:
        return torch.tensor(values, dtype=torch.float32, device=device) if used else None

    prompt_mask = None
    if has_repetition:
        prompt_mask = _token_counts([row.prompt_token_ids for row in rows], vocab_size, device) > 0
    return Penalties(
        output_token_counts=_token_counts([row.output_token_ids for row in rows], vocab_size, device),
        repetition=column(repetition, has_repetition),
        prompt_token_mask=prompt_mask,
        presence=column(presence, has_presence),
        frequency=column(frequency, has_frequency),
    )


def _sparse(
    entries: list[tuple[int, int, float]], device: torch.device | str
) -> TokenBias | None:
    if not entries:
        return None
    rows, cols, values = zip(*entries)
    return TokenBias(
        rows=torch.tensor(rows, dtype=torch.int64, device=device),
        cols=torch.tensor(cols, dtype=torch.int64, device=device),
        values=torch.tensor(values, dtype=torch.float32, device=device),
    )


def _build_logit_bias(rows: list[SamplingRow], vocab_size: int, device: torch.device | str) -> TokenBias | None:
    entries = []
    for i, row in enumerate(rows):
        if row.params.logit_bias:
            # Cheap re-check: an out-of-range id would be a device-side assert on CUDA.
            row.params.validate_for_vocab(vocab_size)
            entries.extend((i, token_id, bias) for token_id, bias in row.params.logit_bias.items())
    return _sparse(entries, device)


def _build_min_tokens_bans(rows: list[SamplingRow], device: torch.device | str) -> TokenBias | None:
    entries = [
        (i, token_id, float("-inf"))
        for i, row in enumerate(rows)
        if row.step < row.params.min_tokens
        for token_id in row.stop_token_ids_for_min_tokens
    ]
    return _sparse(entries, device)
