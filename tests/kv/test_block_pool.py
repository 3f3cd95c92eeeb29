from __future__ import annotations

import numpy as np
import pytest
import xxhash

from ember.kv.block_pool import BlockPool
from ember.kv.managers import KVCacheManager
from ember.kv.prefix_hash import cache_namespace, hash_blocks
from ember.request import Request
from ember.sampling_params import SamplingParams

NS = cache_namespace("model", "bf16")


def make_request(req_id: str, tokens: list[int], **params) -> Request:
    return Request(req_id, tokens, SamplingParams(**params), 0, [], 16)


def test_pool_reserves_null_block_and_recycles_lru():
    pool = BlockPool(5)
    assert pool.num_free_blocks == 4
    a = pool.take_new(2)
    assert 0 not in a and pool.num_free_blocks == 2
    pool.cache_block(a[0], b"h0")
    pool.free(a)
    assert pool.num_free_blocks == 4 and pool.lookup(b"h0") == a[0]
    pool.take_new(4)  # reuses everything, evicting the cached block
    assert pool.lookup(b"h0") is None


def test_hash_chain_depends_on_prefix_and_namespace():
    a = hash_blocks(NS, list(range(32)), 16)
    b = hash_blocks(NS, [99] + list(range(1, 32)), 16)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # a change in block 0 changes every later hash
    assert hash_blocks(cache_namespace("other", "bf16"), list(range(32)), 16)[0] != a[0]
    assert hash_blocks(NS, list(range(40)), 16) == a  # the partial block is not hashed


def test_block_hash_is_xxh3_of_parent_then_int64_token_ids():
    """The cache key's byte format (tiers and checkpoints store it): must not change without FORMAT_VERSION."""
    tokens = [0, 1, 151935, 2**40]
    expected = xxhash.xxh3_128(NS + np.asarray(tokens, dtype=np.int64).tobytes()).digest()
    assert hash_blocks(NS, tokens, 4) == [expected]


def test_prefix_hit_shares_blocks_and_leaves_last_token():
    kv = KVCacheManager(BlockPool(16), 4, NS)
    first = make_request("a", list(range(12)))
    assert kv.allocate(first, 12)
    first.num_computed_tokens = 12
    kv.cache_computed(first)
    second = make_request("b", list(range(12)))
    hit = kv.find_cached_prefix(second)
    assert hit == first.block_ids[:2]  # 3 full blocks, the last one recomputed for the first logits
    assert kv.allocate(second, 4, hit)
    assert kv.pool.blocks[hit[0]].ref_cnt == 2
    kv.free(first)
    kv.free(second)
    assert kv.pool.num_free_blocks == 15


def test_prompt_logprobs_requests_bypass_the_cache():
    kv = KVCacheManager(BlockPool(16), 4, NS)
    r = make_request("a", list(range(12)))
    kv.allocate(r, 12)
    r.num_computed_tokens = 12
    kv.cache_computed(r)
    assert kv.find_cached_prefix(make_request("b", list(range(12)), prompt_logprobs=0)) == []


def test_allocate_refuses_without_changing_state():
    kv = KVCacheManager(BlockPool(4), 4, NS)
    r = make_request("a", list(range(20)))
    assert not kv.allocate(r, 20)
    assert r.block_ids == [] and kv.pool.num_free_blocks == 3
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)
