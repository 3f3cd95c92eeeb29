"""Recurrent-state slots of hybrid models (Gated DeltaNet layers): the tensors, and the per-step metadata that
tells each layer which slot a sequence reads its initial state from, which it writes, and where to snapshot.

Slot ids come from the scheduler side (kv/state_pool.py); one id space covers running requests' working slots
and prefix-cache snapshots, so restoring a cached prefix is just reading a snapshot slot instead of zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.engine.scheduler import ScheduledSeq
from ember.kv.spec import LayerCacheSpec, RecurrentStateSpec
from ember.ops.gated_delta import ChunkPlan


@dataclass(slots=True)
class StateMetadata:
    """Per sequence of the step, in batch order. Prefill reads the host lists; a decode-only step reads only the
    device tensors (a captured graph's metadata has empty host lists) and leaves its snapshots to the runner."""

    read_slots_cpu: list[int]  # slot holding the state before this chunk; -1: start from zeros
    write_slots_cpu: list[int]  # the request's working slot, holding its state after this chunk
    # (tokens into this chunk, slot): copy the state after that many of the chunk's tokens into the slot
    snapshots_cpu: list[tuple[tuple[int, int], ...]]
    read_slots: torch.Tensor  # [B] int64 device copies for batched decode
    write_slots: torch.Tensor
    _plan: ChunkPlan | None = None  # the prefill layout, built by the first layer that needs it

    def chunk_plan(self, query_start_loc: list[int], width: int, device: torch.device) -> ChunkPlan:
        """The step's batched chunk layout (ops.gated_delta.ChunkPlan); every Gated DeltaNet layer of a model has
        the same conv width, so one plan serves the step."""
        if self._plan is None or self._plan.width != width:
            self._plan = ChunkPlan.build(query_start_loc, self.read_slots_cpu, self.write_slots_cpu,
                                         self.snapshots_cpu, width, device)
        return self._plan

    @classmethod
    def build(cls, seqs: list[ScheduledSeq], device: torch.device) -> StateMetadata | None:
        if not seqs or seqs[0].state is None:
            return None
        reads = [s.state.read_slot for s in seqs]
        writes = [s.state.write_slot for s in seqs]
        snaps = [s.state.snapshots for s in seqs]
        return cls(reads, writes, snaps, torch.tensor(reads, dtype=torch.int64, device=device),
                   torch.tensor(writes, dtype=torch.int64, device=device))


class StateCache:
    """One [num_slots + 1, *shape] tensor per state tensor of every recurrent layer. The extra slot past the pool's
    ids (`scratch_slot`) is where padding rows of a graph-captured decode step write, like KV scratch block 0."""

    def __init__(self, specs: list[LayerCacheSpec], num_slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_slots = num_slots
        self.scratch_slot = num_slots
        self.layers: dict[int, dict[str, torch.Tensor]] = {
            i: {t.name: torch.zeros((num_slots + 1, *t.shape), dtype=t.dtype or dtype, device=device)
                for t in spec.tensors}
            for i, spec in enumerate(specs) if isinstance(spec, RecurrentStateSpec)
        }

    def copy_slots(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copies slot src_slots[i] into dst_slots[i] in every recurrent layer (e.g. working slots into the snapshot
        slots a decode step took); dst_slots are distinct."""
        for tensors in self.layers.values():
            for t in tensors.values():
                t.index_copy_(0, dst_slots, t.index_select(0, src_slots))

    def export(self, slot: int) -> dict[str, torch.Tensor]:
        """One slot's state as named tensors ("layers.{i}.{name}"): what a host/SSD tier or a checkpoint stores
        next to a block's KV. The names and shapes come from the model's specs, so tiers need no model code."""
        return {f"layers.{i}.{name}": t[slot].clone() for i, d in self.layers.items() for name, t in d.items()}

    def load(self, slot: int, tensors: dict[str, torch.Tensor]) -> None:
        for i, d in self.layers.items():
            for name, t in d.items():
                t[slot].copy_(tensors[f"layers.{i}.{name}"])
