"""Recurrent-state slot ids for hybrid models, seen by the scheduler (never tensors; worker/state_cache.py holds
those). Two kinds of slot share one id space:

- working slots: one per running request, holding its state after its last computed token;
- snapshot slots: the state after a block boundary, kept in a side table keyed by that block's prefix hash, so
  a prefix-cache hit restores the recurrent state along with the KV blocks. A snapshot is dropped when its block
  is evicted from the pool, or least-recently-used first when the table is full.

Which boundaries get a snapshot: the last one each scheduled chunk crosses. For prompt chunks that is where a
later request sharing the prompt can resume; while decoding, each request keeps only its latest output snapshot
(enough to resume a multi-turn conversation) so long generations do not flood the table.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StateStep:
    """What a recurrent layer needs for one request's chunk this step (ids only)."""

    read_slot: int  # initial state; -1 means zeros (the request's first chunk)
    write_slot: int  # the request's working slot
    snapshots: tuple[tuple[int, int], ...] = ()  # (tokens into this chunk, snapshot slot)


@dataclass(slots=True)
class _RequestSlots:
    working: int
    restore: bytes | None = None  # pinned snapshot to read at the next chunk (a prefix-cache hit)
    pending: list[bytes] = field(default_factory=list)  # snapshots being written this step
    pending_output: bytes | None = None  # the pending one taken past the prompt, if any
    last_output: bytes | None = None  # the committed snapshot superseded by the next output snapshot


@dataclass(slots=True)
class _Snapshot:
    slot: int
    pins: int = 0


class RecurrentStatePool:
    def __init__(self, num_working: int, num_snapshots: int) -> None:
        if num_working < 1:
            raise ValueError(f"need at least one recurrent-state slot per running request, got {num_working}")
        self.num_working, self.num_snapshots = num_working, num_snapshots
        self._free_working = list(range(num_working - 1, -1, -1))
        self._free_snapshots = list(range(num_working + num_snapshots - 1, num_working - 1, -1))
        self._snapshots: OrderedDict[bytes, _Snapshot] = OrderedDict()  # committed, least recently used first
        self._pending: dict[bytes, int] = {}
        self._requests: dict[str, _RequestSlots] = {}

    @property
    def num_cached_snapshots(self) -> int:
        return len(self._snapshots)

    def has_snapshot(self, block_hash: bytes) -> bool:
        return block_hash in self._snapshots

    # ---- requests
    def admit(self, req_id: str) -> bool:
        """Gives the request a working slot if it has none; False if every slot is taken."""
        if req_id in self._requests:
            return True
        if not self._free_working:
            return False
        self._requests[req_id] = _RequestSlots(self._free_working.pop())
        return True

    def set_restore(self, req_id: str, block_hash: bytes) -> None:
        """The request resumes from the snapshot at block_hash: pin it until the request's next step ran."""
        slots = self._requests[req_id]
        assert slots.restore is None, "one restore per admission"
        self._snapshots[block_hash].pins += 1
        self._snapshots.move_to_end(block_hash)
        slots.restore = block_hash

    def plan(self, req_id: str, is_first_chunk: bool, snapshot_at: tuple[int, bytes, bool] | None) -> StateStep:
        """This chunk's slots. snapshot_at: (tokens into the chunk, block hash, is past the prompt), if a
        snapshot is wanted; it is skipped when that hash has one or no slot can be freed."""
        slots = self._requests[req_id]
        if slots.restore is not None:
            read = self._snapshots[slots.restore].slot
        else:
            read = -1 if is_first_chunk else slots.working
        snapshots: tuple[tuple[int, int], ...] = ()
        if snapshot_at is not None:
            offset, block_hash, is_output = snapshot_at
            slot = self._reserve(block_hash)
            if slot is not None:
                snapshots = ((offset, slot),)
                slots.pending.append(block_hash)
                if is_output:
                    slots.pending_output = block_hash
        return StateStep(read, slots.working, snapshots)

    def step_done(self, req_id: str) -> None:
        """The request's step ran: its snapshots are valid and its restore snapshot may be evicted again."""
        slots = self._requests.get(req_id)
        if slots is None:
            return
        self._unpin_restore(slots)
        for block_hash in slots.pending:
            self._snapshots[block_hash] = _Snapshot(self._pending.pop(block_hash))
        slots.pending = []
        if slots.pending_output is not None:
            if slots.last_output is not None:
                self.drop(slots.last_output)
            slots.last_output, slots.pending_output = slots.pending_output, None

    def set_snapshot_hash(self, req_id: str, stand_in: bytes, block_hash: bytes) -> None:
        """Keys a pending snapshot planned under a stand-in (its block ended in a token not known at planning) by
        its block's hash; if that block already has a snapshot, frees the slot as plan() would have skipped it."""
        slots = self._requests.get(req_id)
        if slots is None or stand_in not in slots.pending:
            return  # released, or no slot was free at planning
        slot = self._pending.pop(stand_in)
        i = slots.pending.index(stand_in)
        is_output = slots.pending_output == stand_in
        if block_hash in self._snapshots or block_hash in self._pending:
            del slots.pending[i]
            self._free_snapshots.append(slot)  # its copy may still run: nothing reads a free slot
            block_hash = None
        else:
            self._pending[block_hash] = slot
            slots.pending[i] = block_hash
        if is_output:
            slots.pending_output = block_hash

    def release(self, req_id: str) -> None:
        """The request finished or was preempted: free its working slot and any snapshot not yet written."""
        slots = self._requests.pop(req_id, None)
        if slots is None:
            return
        self._unpin_restore(slots)
        for block_hash in slots.pending:
            self._free_snapshots.append(self._pending.pop(block_hash))
        self._free_working.append(slots.working)

    # ---- snapshots
    def drop(self, block_hash: bytes) -> None:
        """Forgets the snapshot of an evicted block (kept while a request is about to read it)."""
        snap = self._snapshots.get(block_hash)
        if snap is not None and snap.pins == 0:
            del self._snapshots[block_hash]
            self._free_snapshots.append(snap.slot)

    def clear(self) -> None:
        for block_hash in [h for h, s in self._snapshots.items() if s.pins == 0]:
            self.drop(block_hash)

    def _reserve(self, block_hash: bytes) -> int | None:
        if block_hash in self._snapshots or block_hash in self._pending:
            return None
        if not self._free_snapshots:
            victim = next((h for h, s in self._snapshots.items() if s.pins == 0), None)
            if victim is None:
                return None
            self.drop(victim)
        slot = self._free_snapshots.pop()
        self._pending[block_hash] = slot
        return slot

    def _unpin_restore(self, slots: _RequestSlots) -> None:
        if slots.restore is not None:
            snap = self._snapshots.get(slots.restore)
            if snap is not None:
                snap.pins -= 1
            slots.restore = None
