"""Token embedding and LM head, split over the vocabulary under tensor parallelism (Megatron-LM style)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.linear import load_slice
from ember.parallel import get_tp


def lm_logits(hidden: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """hidden @ weight^T (F.linear's GEMM), written into out where given: CUDA graphs of several batch sizes share
    one logits buffer instead of each keeping its own in the graphs' memory pool."""
    return F.linear(hidden, weight) if out is None else torch.mm(hidden, weight.t(), out=out)


class VocabParallelEmbedding(nn.Module):
    """Each rank holds rows [start, start + per_rank) of the (padded) vocabulary; lookups of other ranks'
    tokens give zeros and one all-reduce assembles the embedding."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp = get_tp()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.per_rank = -(-vocab_size // self.tp.size)
        self.start = self.tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size))

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None, name: str = "") -> None:
        rows = max(0, min(self.per_rank, self.vocab_size - self.start))
        param.data.zero_()  # padding rows of the last rank stay zero
        load_slice(param.data[:rows], loaded, 0, self.start, name, (self.vocab_size, self.hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[:, None], 0.0)
        return self.tp.all_reduce(out)

    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden @ W^T over the whole vocabulary (the LM head, or tied embeddings used as one), into out if given."""
        if self.tp.size == 1:
            return lm_logits(hidden, self.weight, out)
        logits = self.tp.all_gather_last_dim(F.linear(hidden, self.weight))[..., : self.vocab_size]
        return logits if out is None else out.copy_(logits)


class ParallelLMHead(VocabParallelEmbedding):
    """The LM head: column-parallel over the vocabulary; logits are all-gathered, padding columns dropped."""
