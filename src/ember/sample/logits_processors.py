"""Batched logits transforms used by the sampler, in the order it applies them.

Each is out-of-place, fixed-shape and free of host syncs. Conventions follow
vLLM / Hugging Face (repetition penalty) and OpenAI (presence / frequency).
"""

from __future__ import annotations

import torch

from ember.sample.metadata import Penalties, TokenBias

_NEG_INF = float("-inf")


def apply_logit_bias(logits: torch.Tensor, bias: TokenBias) -> torch.Tensor:
    """logits[row, token] += bias for every (row, token, bias) entry. [B, V] -> [B, V]."""
    return logits.index_put((bias.rows, bias.cols), bias.values, accumulate=True)


def apply_token_bans(logits: torch.Tensor, bans: TokenBias) -> torch.Tensor:
    """logits[row, token] = -inf for every banned (row, token). [B, V] -> [B, V]."""
    return logits.index_put((bans.rows, bans.cols), bans.values)


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """Repetition penalty on prompt+output tokens, then presence/frequency on output tokens."""
    counts = penalties.output_token_counts  # [B, V]
    if penalties.repetition is not None:
        assert penalties.prompt_token_mask is not None
        seen = penalties.prompt_token_mask | (counts > 0)
        penalty = penalties.repetition[:, None]
        # Divide positive logits, multiply negative ones: both make the token less likely.
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    if penalties.presence is not None:
        logits = logits - penalties.presence[:, None] * (counts > 0).to(logits.dtype)
    if penalties.frequency is not None:
        logits = logits - penalties.frequency[:, None] * counts
    return logits


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """[B, V] / [B] -> [B, V]. Greedy rows carry temperature 1.0."""
    return logits / temperature[:, None]


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep each row's top_k logits (0 = off). Ties with the k-th value are all kept.

    `max_top_k` is a host int so torch.topk needs no sync on the per-row values.
    """
    k = max(1, min(max_top_k, logits.shape[-1]))
    top_values = logits.topk(k, dim=-1).values  # [B, k], descending
    index = (top_k.clamp(1, k) - 1)[:, None]  # [B, 1]
    threshold = top_values.gather(1, index)
    threshold = threshold.masked_fill((top_k == 0)[:, None], _NEG_INF)
    return logits.masked_fill(logits < threshold, _NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter: keep the smallest prefix of tokens (by probability) whose mass
    reaches top_p. The most likely token is always kept; rows with top_p == 1 are untouched.
    """
    probs_sorted, order = logits.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
    cumulative = probs_sorted.cumsum(dim=-1)
    # Mass strictly before each token; computed as a shifted cumsum, not cumsum - p,
    # to avoid cancellation. Position 0 has 0 < top_p so the top token always stays.
    mass_before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)
    remove_sorted = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, _NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p * (the row's top probability)."""
    probs = logits.softmax(dim=-1)
    threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, _NEG_INF)
