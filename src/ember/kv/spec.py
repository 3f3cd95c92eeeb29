"""Per-layer KV cache specifications. A model declares one spec per layer; the runner allocates tensors from
them and the block manager sizes the pool from their per-token cost."""
from __future__ import annotations

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


LayerCacheSpec = FullAttentionSpec | SlidingWindowSpec | SharedKVSpec


def kv_bytes_per_token(specs: list[LayerCacheSpec], dtype: torch.dtype) -> int:
    return sum(s.bytes_per_token(dtype) for s in specs)
