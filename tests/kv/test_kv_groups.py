"""KV groups: sliding-window layers keep their own block table, release blocks that leave the window, and a
prefix hit needs the window before its end in every sliding group."""
from __future__ import annotations

import torch

from ember.kv.block_pool import BlockPool
from ember.kv.managers import BlockGroup, KVCacheManager
from ember.kv.prefix_hash import cache_namespace
from ember.kv.spec import (FullAttentionSpec, RecurrentStateSpec, SharedKVSpec, SlidingWindowSpec, StateTensor,
                           kv_groups, layer_kv_groups)
from ember.request import Request
from ember.sampling_params import SamplingParams

NS = cache_namespace("model", "bf16")
BS = 4


def make_request(req_id: str, tokens: list[int]) -> Request:
    return Request(req_id, tokens, SamplingParams(), 0, [], 64)


def test_groups_put_full_attention_first_and_shared_layers_with_their_donor():
    specs = [SlidingWindowSpec(2, 8, 16), FullAttentionSpec(2, 16), SlidingWindowSpec(2, 8, 16),
             RecurrentStateSpec((StateTensor("ssm", (2, 2)),)), SharedKVSpec(2), SharedKVSpec(1),
             SlidingWindowSpec(2, 8, 4)]
    groups = kv_groups(specs)
    assert [(g.window, g.layer_ids) for g in groups] == [(None, (1,)), (4, (6,)), (16, (0, 2))]
    assert layer_kv_groups(specs, groups) == [2, 0, 2, None, 2, 0, 1]
    assert groups[2].bytes_per_token(specs, torch.float16) == 2 * (2 * 2 * 8 * 2)
    only_sliding = kv_groups([SlidingWindowSpec(2, 8, 16)] * 2)
    assert len(only_sliding) == 1 and only_sliding[0].window == 16


def run_step(kv: KVCacheManager, request: Request, n: int, cached: list[int] | None = None) -> None:
    assert kv.allocate(request, n, cached)
    request.num_computed_tokens += n + len(cached or []) * BS
    kv.cache_computed(request)


def test_sliding_group_releases_blocks_outside_its_window_and_keeps_them_cached():
    full, sliding = BlockPool(32), BlockPool(8)
    kv = KVCacheManager(full, BS, NS, sliding_groups=[BlockGroup(sliding, window=6)])
    r = make_request("a", list(range(100, 122)))  # 22 tokens
    run_step(kv, r, 13)  # prefill 13: blocks 0-3 held in both groups
    assert len(r.block_ids) == 4 and r.group_block_ids[0].count(0) == 0
    run_step(kv, r, 9)  # queries from 13 attend to keys >= 8: blocks 0, 1 leave the sliding table
    assert r.group_block_ids[0][:2] == [0, 0] and all(r.group_block_ids[0][2:])
    assert len(r.block_ids) == 6 and all(r.block_ids)
    assert sliding.num_used_blocks == 4 and full.num_used_blocks == 6
    kv.free(r)
    assert sliding.num_used_blocks == 0 and r.group_block_ids == []
    # the same prompt again: the full group has all 5 full blocks, the sliding group the ones in the window
    again = make_request("b", list(range(100, 122)))
    hit = kv.find_cached_prefix(again)
    assert len(hit) == 5
    run_step(kv, again, 2, hit)
    assert again.group_block_ids[0][:3] == [0, 0, 0] and all(again.group_block_ids[0][3:])


def test_hit_shrinks_to_where_the_sliding_window_is_still_cached():
    full, sliding = BlockPool(32), BlockPool(8)
    kv = KVCacheManager(full, BS, NS, sliding_groups=[BlockGroup(sliding, window=6)])
    r = make_request("a", list(range(100, 125)))
    run_step(kv, r, 25)
    kv.free(r)
    sliding.take_new(sliding.num_free_blocks - 2)  # evicts the sliding group's 5 least recently freed blocks
    other = make_request("b", list(range(100, 125)) + [1])
    hit = kv.find_cached_prefix(other)  # full blocks 0..5 cached; sliding keeps only blocks 0, 1 (freed last)
    assert len(hit) == 2


def test_only_sliding_layers_release_from_the_main_table():
    pool = BlockPool(16)
    kv = KVCacheManager(pool, BS, NS, window=5)
    r = make_request("a", list(range(30)))
    run_step(kv, r, 12)
    run_step(kv, r, 8)  # queries from 12 need keys >= 8: blocks 0, 1 go
    assert r.block_ids[:2] == [0, 0] and pool.num_used_blocks == 3
    assert kv.can_ever_fit(10_000)  # a window's worth, whatever the length
