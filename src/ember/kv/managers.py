"""KV cache manager: turns the scheduler's token counts into block allocations and prefix-cache hits, and, for
hybrid models, recurrent-state slots (a working slot per request, snapshots stored with cached blocks).

Layers are split into KV groups (kv/spec.kv_groups), each with its own pool and block table per request: the
full-attention layers (group 0, `request.block_ids`) and one group per sliding window
(`request.group_block_ids`). A sliding group releases the blocks that fall out of its window (their table entry
becomes the null block 0); they stay cached in their pool, so a later prefix hit can take them back. A hit must
hold in every group: the whole prefix for full attention, the last window before the hit for sliding groups,
and a state snapshot at its end for recurrent layers. Models with full attention only have one group and
behave as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from ember.kv.block_pool import BlockPool
from ember.kv.prefix_hash import hash_blocks
from ember.kv.state_pool import RecurrentStatePool, StateStep
from ember.request import Request


@dataclass(slots=True)
class BlockGroup:
    pool: BlockPool
    window: int | None = None  # sliding window in tokens; None: full attention

    def first_needed(self, num_tokens: int, block_size: int) -> int:
        """The first block that queries from position num_tokens on still attend to."""
        return 0 if self.window is None else max(0, num_tokens - self.window + 1) // block_size


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, namespace: bytes,
                 states: RecurrentStatePool | None = None, window: int | None = None,
                 sliding_groups: list[BlockGroup] | None = None) -> None:
        self.pool = pool  # group 0's
        self.groups = [BlockGroup(pool, window), *(sliding_groups or [])]
        self.block_size = block_size
        self.namespace = namespace
        self.states = states
        if states is not None:
            pool.on_evict = states.drop
        self._deferred: dict[str, tuple[int, bytes]] = {}  # req_id -> (block index, stand-in snapshot key)
        # one full-attention group and no recurrent state: allocate without a prefix hit only grows block_ids
        self._is_plain = len(self.groups) == 1 and window is None and states is None

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _table(self, request: Request, g: int) -> list[int]:
        if g == 0:
            return request.block_ids
        while len(request.group_block_ids) < g:
            request.group_block_ids.append([])
        return request.group_block_ids[g - 1]

    def _update_hashes(self, request: Request) -> None:
        have, num_full = len(request.block_hashes), request.num_known_tokens // self.block_size
        if num_full <= have:
            return
        parent = request.block_hashes[-1] if have else None
        tokens = request.token_slice(have * self.block_size, num_full * self.block_size)  # the new blocks only
        request.block_hashes += hash_blocks(self.namespace, tokens, self.block_size, parent)

    def _hit_ids(self, group: BlockGroup, hashes: list[bytes]) -> list[int] | None:
        """Group's cached ids for a hit of len(hashes) blocks (0 where its window does not reach), or None."""
        first = group.first_needed(len(hashes) * self.block_size, self.block_size)
        ids = [0] * first
        for block_hash in hashes[first:]:
            block_id = group.pool.lookup(block_hash)
            if block_id is None:
                return None
            ids.append(block_id)
        return ids

    def _longest_hit(self, request: Request, max_blocks: int) -> int:
        hashes = request.block_hashes
        n = 0
        if self.groups[0].window is None:  # full attention: hits are prefix-closed, so scan forward
            while n < max_blocks and self.pool.lookup(hashes[n]) is not None:
                n += 1
        else:
            n = max_blocks
        for n in range(n, 0, -1):  # the others need their window before the end, and a state snapshot there
            if all(self._hit_ids(g, hashes[:n]) is not None for g in self.groups if g.window is not None) and (
                    self.states is None or self.states.has_snapshot(hashes[n - 1])):
                return n
        return 0

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Group 0's cached block ids for the longest prefix every group (and the recurrent state) can resume
        from; the last token is always left to compute (it yields the logits of the first sample)."""
        if not self.pool.enable_caching or request.params.prompt_logprobs is not None:
            return []  # prompt logprobs need the logits of every prompt position
        self._update_hashes(request)
        n = self._longest_hit(request, (request.num_tokens - 1) // self.block_size)
        self.pool.num_queries += request.num_tokens
        self.pool.num_hits += n * self.block_size
        return self._hit_ids(self.groups[0], request.block_hashes[:n]) or []

    def allocate(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] | None = None) -> bool:
        """Gives the request blocks for num_computed + cached + num_new tokens in every group, releasing sliding
        blocks that left the window; False (nothing changed) if a pool cannot, counting blocks that evicting
        unreferenced cached blocks would free."""
        if self._is_plain and not cached_block_ids:  # the general path below, reduced to this case
            need = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(request.block_ids)
            if need > 0:
                if need > self.pool.num_free_blocks:
                    return False
                request.block_ids += self.pool.take_new(need)
            return True
        num_hit = len(cached_block_ids or [])
        num_computed = request.num_computed_tokens + num_hit * self.block_size
        total = self.blocks_for(num_computed + num_new_tokens)
        plans = []
        for g, group in enumerate(self.groups):
            table = self._table(request, g)
            hit = (cached_block_ids or []) if g == 0 else self._hit_ids(group, request.block_hashes[:num_hit])
            assert hit is not None, "find_cached_prefix checked every group"
            first = group.first_needed(num_computed, self.block_size)
            released = [i for i in range(min(first, len(table))) if table[i]]
            pool = group.pool
            # released blocks nobody else holds return to the free queue; unreferenced hits leave it
            available = (pool.num_free_blocks + sum(1 for i in released if pool.blocks[table[i]].ref_cnt == 1)
                         - sum(1 for b in hit if b and pool.blocks[b].ref_cnt == 0))
            need = total - len(table) - len(hit)
            if need > available:
                return False
            plans.append((group, table, hit, released, need))
        if self.states is not None:
            if not self.states.admit(request.req_id):
                return False
            if num_hit:
                self.states.set_restore(request.req_id, request.block_hashes[num_hit - 1])
        for group, table, hit, released, need in plans:
            group.pool.free([table[i] for i in released])
            for i in released:
                table[i] = 0
            group.pool.touch([b for b in hit if b])
            table += hit
            if need > 0:
                table += group.pool.take_new(need)
        return True

    def cache_computed(self, request: Request) -> None:
        """Registers the request's full, computed blocks under their hashes (and its state snapshots)."""
        if self.states is not None:
            deferred = self._deferred.pop(request.req_id, None)
            if deferred is not None:  # its block's last token is known now
                self._update_hashes(request)
                self.states.set_snapshot_hash(request.req_id, deferred[1], request.block_hashes[deferred[0]])
            self.states.step_done(request.req_id)
        if not self.pool.enable_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= request.num_registered_blocks:  # no block filled since the last call (most decode steps)
            return
        self._update_hashes(request)  # hashes every full block of num_tokens >= num_computed_tokens
        for g, group in enumerate(self.groups):
            table = self._table(request, g)
            for i in range(request.num_registered_blocks, num_full):
                if table[i]:  # blocks a sliding group never held (before a prefix hit's window) are 0
                    group.pool.cache_block(table[i], request.block_hashes[i])
        request.num_registered_blocks = num_full

    def plan_state(self, request: Request, num_new_tokens: int) -> StateStep | None:
        """Recurrent-state slots of the request's next chunk; None for attention-only models. Snapshots the
        state at the last block boundary the chunk crosses, keyed by that block's hash. A block ending in a
        placeholder token (async scheduling) is keyed by a stand-in until cache_computed knows its hash."""
        if self.states is None:
            return None
        start = request.num_computed_tokens
        boundary = (start + num_new_tokens) // self.block_size * self.block_size
        snapshot_at = None
        if self.pool.enable_caching and boundary > start:
            self._update_hashes(request)
            index = boundary // self.block_size - 1
            if index < len(request.block_hashes):
                block_hash = request.block_hashes[index]
            else:
                block_hash = b"placeholder-snapshot:" + request.req_id.encode()  # longer than any 16-byte hash
                self._deferred[request.req_id] = (index, block_hash)
            snapshot_at = (boundary - start, block_hash, boundary > request.num_prompt_tokens)
        return self.states.plan(request.req_id, start == 0, snapshot_at)

    def free(self, request: Request) -> None:
        for g, group in enumerate(self.groups):
            group.pool.free([b for b in self._table(request, g) if b])
        request.block_ids, request.group_block_ids = [], []  # new lists: a scheduled step may still read the old
        request.num_registered_blocks = 0
        if self.states is not None:
            self._deferred.pop(request.req_id, None)
            self.states.release(request.req_id)

    def can_ever_fit(self, num_tokens: int) -> bool:
        if self.groups[0].window is not None:  # a sliding group holds a window's worth, whatever the length
            num_tokens = min(num_tokens, self.groups[0].window + self.block_size)
        return self.blocks_for(num_tokens) <= self.pool.num_blocks - 1
