"""Per-layer cache specifications. A model declares one spec per layer; the runner allocates tensors from
them and the block manager sizes the pool from their per-token cost (attention) and per-slot cost (recurrent)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class FullAttentionSpec:
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_kv_heads * self.head_dim * dtype.itemsize


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    num_kv_heads: int
    head_dim: int
    window: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_kv_heads * self.head_dim * dtype.itemsize


@dataclass(frozen=True, slots=True)
class SharedKVSpec:
    """A layer that reads the KV written by an earlier donor layer and allocates nothing."""

    donor_layer: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class StateTensor:
    """One named tensor of a recurrent layer's state; dtype None means the model's dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None

    def nbytes(self, dtype: torch.dtype) -> int:
        return math.prod(self.shape) * (self.dtype or dtype).itemsize


@dataclass(frozen=True, slots=True)
class RecurrentStateSpec:
    """A layer whose whole history is a fixed-size state (e.g. Gated DeltaNet: conv window + recurrent matrix).

    It holds one state slot per running request (plus snapshot slots for prefix caching) and no KV blocks.
    """

    tensors: tuple[StateTensor, ...]

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 0

    def bytes_per_slot(self, dtype: torch.dtype) -> int:
        return sum(t.nbytes(dtype) for t in self.tensors)


LayerCacheSpec = FullAttentionSpec | SlidingWindowSpec | SharedKVSpec | RecurrentStateSpec


def kv_bytes_per_token(specs: list[LayerCacheSpec], dtype: torch.dtype) -> int:
    return sum(s.bytes_per_token(dtype) for s in specs)


def state_bytes_per_slot(specs: list[LayerCacheSpec], dtype: torch.dtype) -> int:
    """Bytes of one request's recurrent state over all layers (0 for attention-only models)."""
    return sum(s.bytes_per_slot(dtype) for s in specs if isinstance(s, RecurrentStateSpec))
