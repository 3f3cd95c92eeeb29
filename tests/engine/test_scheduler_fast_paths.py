"""The scheduler's per-step fast paths (plain allocate, registering blocks only when one fills, one-pass removal of
finished requests) against the general code, on random workloads with shared prefixes, chunked prefill,
preemption, eos / stop tokens and the context limit."""
from __future__ import annotations

import pytest

from ember.config import SchedulerConfig
from ember.engine.scheduler import Scheduler
from ember.kv.block_pool import BlockPool
from ember.kv.managers import KVCacheManager
from ember.kv.prefix_hash import hash_blocks
from ember.request import Request, RequestStatus
from ember.sampling_params import SamplingParams
from tests.engine.scheduler_workloads import BLOCK, EOS, NS, sample, workload


def check_registered(kv: KVCacheManager, request: Request) -> None:
    """Every full computed block is in the prefix cache under the hash of the tokens it holds."""
    num_full = request.num_computed_tokens // BLOCK
    assert request.num_registered_blocks == num_full
    hashes = hash_blocks(NS, request.all_token_ids(), BLOCK)
    for i in range(num_full):
        assert kv.pool.lookup(hashes[i]) is not None
        assert request.block_hashes[i] == hashes[i]


def simulate(seed: int, plain: bool, num_blocks: int, budget: int, max_model_len: int) -> list:
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK, NS)
    kv._is_plain = plain and kv._is_plain  # False: every allocate takes the general path
    s = Scheduler(SchedulerConfig(4, budget, max_model_len), kv)
    plan = workload(seed)
    trace = []
    for step in range(400):
        for at, request in plan:
            if at == step:
                s.add_request(request)
        if step > 8 and not s.num_unfinished:
            break
        out = s.schedule()
        trace.append([(q.req_id, list(q.token_ids), q.start_pos, list(q.block_ids), q.do_sample) for q in out.seqs]
                     + [out.preempted_req_ids])
        sampled = sample(out)
        s.update(out, sampled)
        for request in s.running:
            check_registered(kv, request)
        assert all(not r.is_finished for r in s.running)
        trace.append((kv.pool.num_free_blocks, [r.req_id for r in s.running], [r.req_id for r in s.waiting]))
    assert not s.num_unfinished and kv.pool.num_used_blocks == 0
    results = [(r.req_id, r.output_token_ids, r.status, r.stop_reason, r.num_preemptions) for _, r in plan]
    return trace + results


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("num_blocks,budget,max_model_len", [(64, 32, 1024), (14, 8, 1024), (14, 16, 20)])
def test_fast_paths_equal_the_general_path(seed, num_blocks, budget, max_model_len):
    fast = simulate(seed, True, num_blocks, budget, max_model_len)
    slow = simulate(seed, False, num_blocks, budget, max_model_len)
    assert fast == slow


def test_small_pool_workloads_preempt():
    """The small-pool case above is meant to cover preemption and recompute; make sure it does."""
    preemptions = sum(r.num_preemptions for seed in range(12) for _, r in _run_plan(seed, 14, 8))
    assert preemptions > 0


def _run_plan(seed: int, num_blocks: int, budget: int) -> list[tuple[int, Request]]:
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK, NS)
    s = Scheduler(SchedulerConfig(4, budget, 1024), kv)
    plan = workload(seed)
    for step in range(400):
        for at, request in plan:
            if at == step:
                s.add_request(request)
        out = s.schedule()
        s.update(out, sample(out))
    return plan


def test_decode_registers_a_block_once_its_last_token_is_computed():
    kv = KVCacheManager(BlockPool(16), BLOCK, NS)
    s = Scheduler(SchedulerConfig(4, 64, 1024), kv)
    r = Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=8), 0, [EOS], 8)
    s.add_request(r)
    for token in [7, 8, 9, 10, 11]:  # tokens 7, 8 fill block 1; its KV is computed one step later
        out = s.schedule()
        s.update(out, {"a": token})
        check_registered(kv, r)
    assert r.num_computed_tokens == 10 and r.num_registered_blocks == 2


def test_finishing_requests_leave_the_others_running_in_order():
    kv = KVCacheManager(BlockPool(64), BLOCK, NS)
    s = Scheduler(SchedulerConfig(8, 64, 1024), kv)
    lengths = {"a": 3, "b": 1, "c": 2, "d": 1, "e": 3}
    for req_id, n in lengths.items():
        s.add_request(Request(req_id, [1, 2, 3], SamplingParams(max_tokens=n), 0, [EOS], n))
    running = []
    while s.num_unfinished:
        out = s.schedule()
        s.update(out, {q.req_id: 7 for q in out.seqs})
        running.append([r.req_id for r in s.running])
    assert running == [["a", "c", "e"], ["a", "e"], []]
    assert kv.pool.num_used_blocks == 0 and not s.requests


def test_length_stop_at_the_context_window():
    kv = KVCacheManager(BlockPool(16), BLOCK, NS)
    s = Scheduler(SchedulerConfig(4, 64, 8), kv)  # max_model_len 8
    r = Request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=100), 0, [EOS], 100)
    s.add_request(r)
    while s.num_unfinished:
        out = s.schedule()
        s.update(out, {"a": 7})
    assert r.status == RequestStatus.FINISHED_LENGTH and r.num_tokens == 8
