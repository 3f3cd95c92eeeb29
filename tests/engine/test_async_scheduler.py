"""The scheduler under async scheduling's order (schedule step n+1, then complete step n, then advance n+1) against
the serial order (schedule, advance, complete), without a model: random workloads with shared prefixes, chunked
prefill, preemption, eos / stop tokens / stop strings / length stops, and recurrent-state snapshots. The sampled
token is a function of (request, position), so both orders see the same streams and must end the same."""
from __future__ import annotations

import zlib

import pytest

from ember.config import SchedulerConfig
from ember.engine.scheduler import Scheduler, SchedulerOutput
from ember.kv.block_pool import BlockPool
from ember.kv.managers import KVCacheManager
from ember.kv.prefix_hash import hash_blocks
from ember.kv.state_pool import RecurrentStatePool
from ember.request import PLACEHOLDER_TOKEN_ID, Request, RequestStatus
from ember.sampling_params import SamplingParams
from tests.engine.scheduler_workloads import BLOCK, EOS, NS, sample, workload


def is_stop_string(req_id: str, num_tokens: int) -> bool:
    """Whether the output processor 'finds a stop string' once the request holds num_tokens tokens."""
    return zlib.crc32(f"stop:{req_id}:{num_tokens}".encode()) % 23 == 0


def make_scheduler(num_blocks: int, budget: int, max_model_len: int, with_state: bool) -> Scheduler:
    states = RecurrentStatePool(4, 6) if with_state else None
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK, NS, states)
    return Scheduler(SchedulerConfig(4, budget, max_model_len), kv)


def process_outputs(s: Scheduler, updated: list[Request]) -> None:
    for request in updated:  # what EngineCore does with a stop string the output processor found
        if not request.is_finished and is_stop_string(request.req_id, request.num_tokens):
            s.finish(request.req_id, RequestStatus.FINISHED_STOPPED, "stop")


def check_cache(s: Scheduler) -> None:
    """Every hash the request holds is the hash of its real tokens; no state snapshot is keyed by a stand-in."""
    for request in s.running:
        known = request.all_token_ids()[:request.num_known_tokens]
        assert PLACEHOLDER_TOKEN_ID not in known
        assert request.block_hashes == hash_blocks(NS, known, BLOCK)[:len(request.block_hashes)]
        assert request.num_registered_blocks == request.num_computed_tokens // BLOCK
    if s.kv.states is not None:
        assert all(len(h) == 16 for h in s.kv.states._snapshots)


def check_placeholders(out: SchedulerOutput, in_flight: SchedulerOutput | None) -> None:
    """A placeholder is only ever the one token of a decode whose request sampled in the step in flight."""
    sampled_before = {q.req_id for q in in_flight.seqs if q.do_sample} if in_flight is not None else set()
    for q in out.seqs:
        if PLACEHOLDER_TOKEN_ID in q.token_ids:
            assert q.token_ids == [PLACEHOLDER_TOKEN_ID] and q.req_id in sampled_before


def results(plan: list[tuple[int, Request]]) -> list:
    return [(r.req_id, r.output_token_ids, r.status, r.stop_reason) for _, r in plan]


def run_serial(s: Scheduler, plan: list[tuple[int, Request]]) -> list:
    for step in range(400):
        for at, request in plan:
            if at == step:
                s.add_request(request)
        if step > 8 and not s.num_unfinished:
            break
        out = s.schedule()
        process_outputs(s, s.update(out, sample(out)))
        check_cache(s)
    assert not s.num_unfinished and s.kv.pool.num_used_blocks == 0
    return results(plan)


def run_async(s: Scheduler, plan: list[tuple[int, Request]]) -> list:
    in_flight: tuple[SchedulerOutput, dict[str, int]] | None = None
    for step in range(400):
        for at, request in plan:
            if at == step:
                s.add_request(request)
        if step > 8 and not s.num_unfinished and in_flight is None:
            break
        out = s.schedule()
        check_placeholders(out, in_flight[0] if in_flight else None)
        sampled = sample(out)  # the 'device' needs positions only, not the placeholders' values
        if in_flight is not None:
            process_outputs(s, s.complete(*in_flight))
        in_flight = None
        if not out.is_empty:
            s.advance(out)
            in_flight = (out, sampled)
        check_cache(s)
    assert not s.num_unfinished and s.kv.pool.num_used_blocks == 0
    if s.kv.states is not None:
        assert not s.kv.states._pending and not s.kv._deferred
    return results(plan)


CASES = [(64, 32, 1024), (14, 8, 1024), (14, 16, 24), (10, 6, 1024)]  # roomy; preempting; context limit; tight


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("num_blocks,budget,max_model_len", CASES)
@pytest.mark.parametrize("seed", range(10))
def test_async_order_ends_as_the_serial_order(seed, num_blocks, budget, max_model_len, with_state):
    max_total = (num_blocks - 1) * BLOCK
    serial = run_serial(make_scheduler(num_blocks, budget, max_model_len, with_state),
                        workload(seed, 20, max_total, max_model_len))
    ours = run_async(make_scheduler(num_blocks, budget, max_model_len, with_state),
                     workload(seed, 20, max_total, max_model_len))
    assert ours == serial


def test_the_workloads_preempt_with_tokens_in_flight():
    """The tight cases above must preempt requests whose last token is still a placeholder."""
    count = 0
    for seed in range(10):
        s = make_scheduler(10, 6, 1024, False)
        preempt = s._preempt

        def spy(request, preempt=preempt):
            nonlocal count
            count += request.num_placeholders > 0
            preempt(request)

        s._preempt = spy
        run_async(s, workload(seed, 20, 9 * BLOCK, 1024))
    assert count > 0


def step_async(s: Scheduler, in_flight, token: int = 7):
    out = s.schedule()
    if in_flight is not None:
        s.complete(in_flight, {q.req_id: token for q in in_flight.seqs if q.do_sample})
    s.advance(out)
    return out


def test_length_stop_is_known_without_the_token():
    s = make_scheduler(64, 64, 1024, False)
    r = Request("a", [1, 2, 3], SamplingParams(max_tokens=2), 0, [EOS], 2)
    s.add_request(r)
    first = step_async(s, None)  # prompt; samples output 1
    second = step_async(s, first)  # decodes output 1 (a placeholder at schedule time), samples output 2
    assert second.seqs[0].token_ids == [PLACEHOLDER_TOKEN_ID]
    third = s.schedule()  # output 2 is in flight and is the last: nothing to schedule
    assert third.is_empty and r.output_token_ids == [7, PLACEHOLDER_TOKEN_ID]
    s.complete(second, {"a": 9})
    assert r.status == RequestStatus.FINISHED_LENGTH and r.output_token_ids == [7, 9] and not s.num_unfinished


def test_abort_in_flight_drops_the_placeholder_and_complete_skips_it():
    s = make_scheduler(64, 64, 1024, False)
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=8), 0, [EOS], 8))
    first = step_async(s, None)
    r = s.finish("a", RequestStatus.FINISHED_ABORTED)
    assert r.output_token_ids == [] and r.num_placeholders == 0 and s.kv.pool.num_used_blocks == 0
    s.add_request(Request("a", [4, 5], SamplingParams(max_tokens=8), 0, [EOS], 8))  # the id, reused at once
    assert s.complete(first, {"a": 9}) == []  # the old step's token is not the new request's
    assert s.requests["a"].output_token_ids == []


def test_preempted_request_gets_its_in_flight_token_before_readmission():
    s = make_scheduler(4, 64, 1024, False)  # 3 usable blocks of 4 tokens
    a = Request("a", [1, 2, 3, 4], SamplingParams(max_tokens=8), 0, [EOS], 8)
    b = Request("b", [5, 6, 7], SamplingParams(max_tokens=8), 0, [EOS], 8)
    s.add_request(a)
    s.add_request(b)
    first = step_async(s, None)  # both prompts; a holds 2 blocks (room for its first output), b 1
    second = s.schedule()  # a's decode needs no new block; b's (position 3) fits; then
    s.complete(first, {"a": 10, "b": 11})
    s.advance(second)
    third = s.schedule()  # a's next decode at 5 fits in block 2; b's at 4 needs a 4th block: b preempted
    assert third.preempted_req_ids == ["b"] and b.output_token_ids == [11, PLACEHOLDER_TOKEN_ID]
    s.complete(second, {"a": 12, "b": 13})  # b, waiting, gets the token it was computing
    assert b.output_token_ids == [11, 13] and b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    s.advance(third)
    fourth = s.schedule()
    assert all(PLACEHOLDER_TOKEN_ID not in q.token_ids for q in fourth.seqs if q.req_id == "b")


def test_decode_snapshot_of_a_block_ending_in_a_placeholder_is_keyed_once_known():
    s = make_scheduler(64, 64, 1024, True)
    r = Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=8), 0, [EOS], 8)
    s.add_request(r)
    first = step_async(s, None)  # prompt of 6: snapshot at 4
    second = s.schedule()  # decodes output 1 at position 6: no boundary
    s.complete(first, {"a": 7})
    s.advance(second)
    third = s.schedule()  # decodes output 2 at position 7: crosses 8, a block ending in that placeholder
    assert third.seqs[0].state.snapshots and s.kv._deferred
    s.complete(second, {"a": 8})
    s.advance(third)  # the block's tokens are known now: its snapshot is committed under their hash
    states = s.kv.states
    assert not s.kv._deferred and states.has_snapshot(hash_blocks(NS, [1, 2, 3, 4, 5, 6, 7, 8], BLOCK)[1])
    assert all(len(h) == 16 for h in states._snapshots)
