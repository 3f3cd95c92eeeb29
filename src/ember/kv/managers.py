"""KV cache manager: turns the scheduler's token counts into block allocations and prefix-cache hits, and, for
hybrid models, recurrent-state slots (a working slot per request, snapshots stored with cached blocks)."""
from __future__ import annotations

from ember.kv.block_pool import BlockPool
from ember.kv.prefix_hash import hash_blocks
from ember.kv.state_pool import RecurrentStatePool, StateStep
from ember.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, namespace: bytes,
                 states: RecurrentStatePool | None = None) -> None:
        self.pool = pool
        self.block_size = block_size
        self.namespace = namespace
        self.states = states
        if states is not None:
            pool.on_evict = states.drop

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
        if self.states is not None:  # a hybrid model resumes only where a state snapshot was kept
            while hit and not self.states.has_snapshot(request.block_hashes[len(hit) - 1]):
                hit.pop()
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
        if self.states is not None:
            if not self.states.admit(request.req_id):
                return False
            if cached:
                self.states.set_restore(request.req_id, request.block_hashes[len(cached) - 1])
        if cached:
            self.pool.touch(cached)
            request.block_ids += cached
        if need > 0:
            request.block_ids += self.pool.take_new(need)
        return True

    def cache_computed(self, request: Request) -> None:
        """Registers the request's full, computed blocks under their hashes (and its state snapshots)."""
        if self.states is not None:
            self.states.step_done(request.req_id)
        if not self.pool.enable_caching:
            return
        self._update_hashes(request)
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_hashes))
        for i in range(request.num_registered_blocks, num_full):
            self.pool.cache_block(request.block_ids[i], request.block_hashes[i])
        request.num_registered_blocks = max(request.num_registered_blocks, num_full)

    def plan_state(self, request: Request, num_new_tokens: int) -> StateStep | None:
        """Recurrent-state slots of the request's next chunk; None for attention-only models. Snapshots the
        state at the last block boundary the chunk crosses, keyed by that block's hash."""
        if self.states is None:
            return None
        start = request.num_computed_tokens
        boundary = (start + num_new_tokens) // self.block_size * self.block_size
        snapshot_at = None
        if self.pool.enable_caching and boundary > start:
            self._update_hashes(request)
            block_hash = request.block_hashes[boundary // self.block_size - 1]
            snapshot_at = (boundary - start, block_hash, boundary > request.num_prompt_tokens)
        return self.states.plan(request.req_id, start == 0, snapshot_at)

    def free(self, request: Request) -> None:
        self.pool.free(request.block_ids)
        request.block_ids = []
        request.num_registered_blocks = 0
        if self.states is not None:
            self.states.release(request.req_id)

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= self.pool.num_blocks - 1
