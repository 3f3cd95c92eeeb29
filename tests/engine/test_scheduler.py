from __future__ import annotations

from ember.config import SchedulerConfig
from ember.engine.scheduler import Scheduler
from ember.kv.block_pool import BlockPool
from ember.kv.managers import KVCacheManager
from ember.kv.prefix_hash import cache_namespace
from ember.request import Request, RequestStatus
from ember.sampling_params import SamplingParams


def make(num_blocks=64, budget=32, max_seqs=8, block_size=4):
    kv = KVCacheManager(BlockPool(num_blocks), block_size, cache_namespace("m", "f32"))
    return Scheduler(SchedulerConfig(max_seqs, budget, 1024), kv)


def req(req_id, n, max_tokens=8):
    return Request(req_id, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), 0, [0], max_tokens)


def run_step(s: Scheduler, token: int = 7):
    out = s.schedule()
    sampled = {seq.req_id: token for seq in out.seqs if seq.do_sample}
    s.update(out, sampled)
    return out


def test_budget_chunks_long_prompts_and_interleaves_decodes():
    s = make(budget=16)
    s.add_request(req("short", 3))
    s.add_request(req("long", 40))
    out = s.schedule()
    assert [(q.req_id, len(q.token_ids)) for q in out.seqs] == [("short", 3), ("long", 13)]
    assert out.seqs[0].do_sample and not out.seqs[1].do_sample
    s.update(out, {"short": 5})
    out = s.schedule()
    assert [(q.req_id, len(q.token_ids), q.start_pos) for q in out.seqs] == [("short", 1, 3), ("long", 15, 13)]


def test_finishes_on_max_tokens_and_eos_and_frees_blocks():
    s = make()
    s.add_request(req("a", 5, max_tokens=2))
    s.add_request(req("b", 5, max_tokens=5))
    run_step(s, 3)
    out = s.schedule()
    s.update(out, {"a": 3, "b": 0})  # 0 is b's eos
    assert s.num_unfinished == 0
    assert s.kv.pool.num_used_blocks == 0


def test_preemption_recomputes_and_keeps_order():
    s = make(num_blocks=6, budget=64, block_size=4)  # 5 usable blocks = 20 tokens
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 8, max_tokens=8))
    preempted = []
    for _ in range(30):
        if not s.num_unfinished:
            break
        out = run_step(s)
        preempted += out.preempted_req_ids
    assert s.num_unfinished == 0 and "b" in preempted
    assert s.kv.pool.num_used_blocks == 0


def test_abort_frees_blocks_at_once():
    s = make()
    s.add_request(req("a", 10))
    run_step(s)
    assert s.kv.pool.num_used_blocks > 0
    r = s.finish("a", RequestStatus.FINISHED_ABORTED)
    assert r.status.finish_reason == "abort" and s.kv.pool.num_used_blocks == 0 and s.num_unfinished == 0
    assert s.finish("a", RequestStatus.FINISHED_ABORTED) is None
