"""The KV block pool seen by the scheduler: block ids, reference counts and prefix hashes, never tensors.

Free blocks sit in an LRU queue; a freed block keeps its hash (and KV) until it is reused, so a later request
with the same prefix can take it back. Block 0 is reserved as the scratch block padding tokens write into.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


@dataclass(slots=True)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV pool needs at least 2 blocks, got {num_blocks}; give it more memory")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.blocks[0].ref_cnt = 1  # null block, never freed
        # free blocks, least recently used first
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self._cached: dict[bytes, int] = {}
        self.num_hits = self.num_queries = 0  # tokens, for the hit-rate metric
        # called with each hash whose block is evicted, so side tables (recurrent-state snapshots) follow it
        self.on_evict: Callable[[bytes], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    def lookup(self, block_hash: bytes) -> int | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def take_new(self, n: int) -> list[int]:
        assert n <= len(self._free), "caller checks num_free_blocks first"
        ids = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict: its KV is about to be overwritten
                self._cached.pop(block.block_hash, None)
                if self.on_evict is not None:
                    self.on_evict(block.block_hash)
                block.block_hash = None
            block.ref_cnt = 1
            ids.append(block_id)
        return ids

    def touch(self, block_ids: list[int]) -> None:
        """Takes a reference on cached blocks (a prefix hit); unreferenced ones leave the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self._free[block_id]
            block.ref_cnt += 1

    def free(self, block_ids: list[int]) -> None:
        # tail blocks first, so eviction takes a sequence's last blocks before its shared prefix
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"double free of block {block_id}"
            if block.ref_cnt == 0:
                self._free[block_id] = None

    def cache_block(self, block_id: int, block_hash: bytes) -> None:
        if not self.enable_caching or block_hash in self._cached:
            return
        self.blocks[block_id].block_hash = block_hash
        self._cached[block_hash] = block_id

    def reset_prefix_cache(self) -> None:
        for block_id in self._free:
            block = self.blocks[block_id]
            if block.block_hash is not None and self.on_evict is not None:
                self.on_evict(block.block_hash)
            block.block_hash = None
        self._cached = {h: b for h, b in self._cached.items() if self.blocks[b].ref_cnt > 0}
