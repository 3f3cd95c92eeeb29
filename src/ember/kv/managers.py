"""KV cache manager: turns the scheduler's token counts into block allocations and prefix-cache hits."""
from __future__ import annotations

from ember.kv.block_pool import BlockPool
from ember.kv.prefix_hash import hash_blocks
from ember.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, namespace: bytes) -> None:
        self.pool = pool
        self.block_size = block_size
        self.namespace = namespace

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _update_hashes(self, request: Request) -> None:
        have = len(request.block_hashes)
        if (have + 1) * self.block_size > request.num_tokens:
            return
        parent = request.block_hashes[-1] if have else None
        request.block_hashes += hash_blocks(self.namespace, request.all_token_ids(), self.block_size, parent, have)

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached block ids covering the longest prefix; the last token is always left to compute (it yields
        the logits of the first sample)."""
        if not self.pool.enable_caching or request.params.prompt_logprobs is not None:
            return []  # prompt logprobs need the logits of every prompt position
        self._update_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit = []
        for block_hash in request.block_hashes[:max_blocks]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            hit.append(block_id)
        self.pool.num_queries += request.num_tokens
        self.pool.num_hits += len(hit) * self.block_size
        return hit

    def allocate(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] | None = None) -> bool:
        """Gives the request blocks for num_computed + cached + num_new tokens; False (nothing changed) if the
        pool cannot, counting blocks that evicting unreferenced cached blocks would free."""
        cached = cached_block_ids or []
        num_computed = request.num_computed_tokens + len(cached) * self.block_size
        need = self.blocks_for(num_computed + num_new_tokens) - len(request.block_ids) - len(cached)
        # cached blocks with no other user are counted as free; touching them takes them out of the queue
        num_evictable_hits = sum(1 for b in cached if self.pool.blocks[b].ref_cnt == 0)
        if need > self.pool.num_free_blocks - num_evictable_hits:
            return False
        if cached:
            self.pool.touch(cached)
            request.block_ids += cached
        if need > 0:
            request.block_ids += self.pool.take_new(need)
        return True

    def cache_computed(self, request: Request) -> None:
        """Registers the request's full, computed blocks under their hashes."""
        if not self.pool.enable_caching:
            return
        self._update_hashes(request)
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_hashes))
        for i in range(request.num_registered_blocks, num_full):
            self.pool.cache_block(request.block_ids[i], request.block_hashes[i])
        request.num_registered_blocks = max(request.num_registered_blocks, num_full)

    def free(self, request: Request) -> None:
        self.pool.free(request.block_ids)
        request.block_ids = []
        request.num_registered_blocks = 0

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= self.pool.num_blocks - 1
