"""The batched sampler: raw logits -> one token per row (+ optional logprobs).

Order follows vLLM v1: logprobs from the raw logits; then logit bias, min_tokens
bans and penalties; greedy rows take the argmax; random rows get temperature,
top-k, top-p, min-p, softmax, and a Gumbel-max draw from counter-based noise
(`ember.sample.random`), so a row's token never depends on the rest of the batch.
No host syncs: python branches only on the metadata's None / bool fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.sample import logits_processors as lp
from ember.sample.metadata import SamplingMetadata
from ember.sample.random import sample_from_probs


@dataclass(slots=True)
class LogprobsTensors:
    token_ids: torch.Tensor  # [N, K+1] int64: column 0 is the chosen token, then the top-K ids
    logprobs: torch.Tensor  # [N, K+1] float32, same layout
    ranks: torch.Tensor  # [N] int64, 1-based rank of the chosen token


@dataclass(slots=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobsTensors:
    """Log-probabilities of `token_ids` and each row's top-k, from unprocessed logits.

    logits: [N, V]; token_ids: [N] int64. Rank 1 = most likely; tokens tied with the
    chosen one do not push its rank down.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    chosen = logprobs.gather(1, token_ids[:, None])  # [N, 1]
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # [N]
    if k == 0:
        return LogprobsTensors(token_ids[:, None], chosen, ranks)
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)  # [N, k]
    return LogprobsTensors(
        token_ids=torch.cat([token_ids[:, None], top_ids], dim=1),
        logprobs=torch.cat([chosen, top_logprobs], dim=1),
        ranks=ranks,
    )


class Sampler:
    """Stateless; all per-request state arrives in `SamplingMetadata`."""

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits: [B, V] float32 -> one sampled token per row."""
        raw_logits = logits
        logits = self.process_logits(logits, meta)
        sampled = self.sample(logits, meta)
        logprobs = None
        if meta.max_num_logprobs is not None:
            logprobs = compute_logprobs(raw_logits, sampled, meta.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    @staticmethod
    def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Transforms shared by greedy and random rows. [B, V] -> [B, V]."""
        if meta.logit_bias is not None:
            logits = lp.apply_logit_bias(logits, meta.logit_bias)
        if meta.min_tokens_bans is not None:
            logits = lp.apply_token_bans(logits, meta.min_tokens_bans)
        if meta.penalties is not None:
            logits = lp.apply_penalties(logits, meta.penalties)
        return logits

    @staticmethod
    def sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Greedy argmax and/or a seeded random draw per row. [B, V] -> [B] int64."""
        greedy = None if meta.all_random else logits.argmax(dim=-1)
        if meta.all_greedy:
            assert greedy is not None
            return greedy
        logits = lp.apply_temperature(logits, meta.temperature)
        if meta.top_k is not None:
            logits = lp.apply_top_k(logits, meta.top_k, meta.max_top_k)
        if meta.top_p is not None:
            logits = lp.apply_top_p(logits, meta.top_p)
        if meta.min_p is not None:
            logits = lp.apply_min_p(logits, meta.min_p)
        sampled = sample_from_probs(logits.softmax(dim=-1), meta.seeds, meta.steps)
        if greedy is None:
            return sampled
        return torch.where(meta.is_greedy, greedy, sampled)
