"""Recurrent-state slots and snapshots (scheduler side, no tensors)."""
from __future__ import annotations

from ember.kv.block_pool import BlockPool
from ember.kv.managers import KVCacheManager
from ember.kv.prefix_hash import cache_namespace
from ember.kv.state_pool import RecurrentStatePool, StateStep
from ember.request import Request
from ember.sampling_params import SamplingParams

NS = cache_namespace("model", "bf16")


def make_request(req_id: str, tokens: list[int]) -> Request:
    return Request(req_id, tokens, SamplingParams(), 0, [], 16)


def test_working_slots_are_per_request_and_recycled():
    states = RecurrentStatePool(num_working=2, num_snapshots=0)
    assert states.admit("a") and states.admit("b") and states.admit("a")
    assert not states.admit("c")
    first = states.plan("a", True, None)
    assert first == StateStep(-1, first.write_slot) and states.plan("a", False, None).read_slot == first.write_slot
    states.release("a")
    assert states.admit("c")


def test_snapshot_commits_after_the_step_and_evicts_lru_unpinned():
    states = RecurrentStatePool(num_working=1, num_snapshots=2)
    states.admit("a")
    step = states.plan("a", True, (16, b"h1", False))
    assert len(step.snapshots) == 1 and step.snapshots[0][0] == 16
    assert not states.has_snapshot(b"h1")  # not written yet
    states.step_done("a")
    assert states.has_snapshot(b"h1")
    for h in (b"h2", b"h3"):
        states.plan("a", False, (16, h, False))
        states.step_done("a")
    assert not states.has_snapshot(b"h1") and states.has_snapshot(b"h2") and states.has_snapshot(b"h3")
    states.release("a")
    states.admit("b")
    states.set_restore("b", b"h2")  # pinned: survives eviction pressure and block eviction
    assert states.plan("b", False, (16, b"h4", False)).read_slot >= 1
    states.drop(b"h2")
    assert states.has_snapshot(b"h2") and not states.has_snapshot(b"h3")
    states.step_done("b")
    states.drop(b"h2")
    assert not states.has_snapshot(b"h2") and states.has_snapshot(b"h4")


def test_output_snapshots_supersede_each_other_and_pending_ones_die_with_the_request():
    states = RecurrentStatePool(num_working=1, num_snapshots=4)
    states.admit("a")
    states.plan("a", True, (48, b"prompt", False))
    states.step_done("a")
    for h in (b"out1", b"out2"):
        states.plan("a", False, (1, h, True))
        states.step_done("a")
    assert states.has_snapshot(b"prompt") and states.has_snapshot(b"out2") and not states.has_snapshot(b"out1")
    states.plan("a", False, (1, b"out3", True))
    states.release("a")  # preempted before the step's results were taken
    assert not states.has_snapshot(b"out3") and states.num_cached_snapshots == 2


def test_manager_resumes_only_at_a_snapshot_and_drops_it_with_its_block():
    pool = BlockPool(8)
    kv = KVCacheManager(pool, 4, NS, RecurrentStatePool(num_working=2, num_snapshots=4))
    tokens = list(range(100, 111))  # 11 tokens: blocks 0, 1 full
    a = make_request("a", tokens)
    assert kv.allocate(a, 11)
    step = kv.plan_state(a, 11)
    assert step.read_slot == -1 and step.snapshots[0][0] == 8  # the last boundary the chunk crosses
    a.num_computed_tokens = 11
    kv.cache_computed(a)
    kv.free(a)
    b = make_request("b", tokens + [1, 2])
    hit = kv.find_cached_prefix(b)
    assert len(hit) == 2  # blocks 0 and 1, and a snapshot after block 1
    assert kv.allocate(b, 13 - 8, hit)
    b.num_computed_tokens = 8
    assert kv.plan_state(b, 5).read_slot == step.snapshots[0][1]
    kv.free(b)
    c = make_request("c", tokens[:4] + [7] * 9)  # shares block 0 only, which has no snapshot
    assert kv.find_cached_prefix(c) == []
    pool.take_new(pool.num_free_blocks)  # evicts every cached block, and the snapshot with block 1
    assert kv.states.num_cached_snapshots == 0
