"""Per-layer cache specifications. A model declares one spec per layer; the runner allocates tensors from
them and the block manager sizes the pool from their per-token cost (attention) and per-slot cost (recurrent)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

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


def with_recurrent_dtype(specs: list[LayerCacheSpec], dtype: torch.dtype) -> list[LayerCacheSpec]:
    """specs with the recurrent layers' wide tensors (those of a fixed dtype: Gated DeltaNet's float32 state
    matrix) stored in dtype instead; the tensors in the model's dtype (conv windows) stay as they are."""
    return [RecurrentStateSpec(tuple(replace(t, dtype=dtype) if t.dtype is not None else t for t in s.tensors))
            if isinstance(s, RecurrentStateSpec) else s for s in specs]


def kv_bytes_per_token(specs: list[LayerCacheSpec], dtype: torch.dtype) -> int:
    return sum(s.bytes_per_token(dtype) for s in specs)


def state_bytes_per_slot(specs: list[LayerCacheSpec], dtype: torch.dtype) -> int:
    """Bytes of one request's recurrent state over all layers (0 for attention-only models)."""
    return sum(s.bytes_per_slot(dtype) for s in specs if isinstance(s, RecurrentStateSpec))


@dataclass(frozen=True, slots=True)
class KVGroup:
    """Layers whose KV shares one block table and pool: all full-attention layers, or the sliding-window layers
    of one window (whose blocks are released once they fall out of the window)."""

    window: int | None
    layer_ids: tuple[int, ...]  # the layers owning KV tensors (shared layers read their donor's)

    def bytes_per_token(self, specs: list[LayerCacheSpec], dtype: torch.dtype) -> int:
        return sum(specs[i].bytes_per_token(dtype) for i in self.layer_ids)


def kv_groups(specs: list[LayerCacheSpec]) -> list[KVGroup]:
    """Full-attention layers first (group 0, whose block table is the request's main one), then one group per
    sliding window; a model with only sliding layers has its smallest window as group 0. Attention-only models
    with full attention everywhere have exactly one group."""
    by_window: dict[int | None, list[int]] = {}
    for i, spec in enumerate(specs):
        if isinstance(spec, (FullAttentionSpec, SlidingWindowSpec)):
            by_window.setdefault(spec.window if isinstance(spec, SlidingWindowSpec) else None, []).append(i)
    order = sorted(by_window, key=lambda w: -1 if w is None else w)
    return [KVGroup(w, tuple(by_window[w])) for w in order]


def layer_kv_groups(specs: list[LayerCacheSpec], groups: list[KVGroup]) -> list[int | None]:
    """Each layer's group index (shared layers: their donor's; recurrent layers: None)."""
    owner = {i: g for g, group in enumerate(groups) for i in group.layer_ids}
    return [owner.get(s.donor_layer if isinstance(s, SharedKVSpec) else i) for i, s in enumerate(specs)]


def sliding_group_blocks(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Blocks a sliding-window group can ever hold at once: each running request's window plus the block being
    filled, and the step's new tokens; doubled so released blocks stay cached for prefix hits a while."""
    per_request = -(-(window - 1) // block_size) + 2
    return 2 * (max_num_seqs * per_request + -(-max_num_batched_tokens // block_size)) + 1
