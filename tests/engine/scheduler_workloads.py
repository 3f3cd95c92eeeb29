"""Model-free scheduler workloads shared by the scheduler property tests: random requests with shared prefixes,
stop tokens and min_tokens, and a 'sampled' token that depends only on (request, position), so two runs of the
same workload in different orders see the same token streams."""
from __future__ import annotations

import random
import zlib

from ember.engine.scheduler import SchedulerOutput
from ember.kv.prefix_hash import cache_namespace
from ember.request import Request
from ember.sampling_params import SamplingParams

NS = cache_namespace("m", "f32")
BLOCK = 4
EOS = 0


def workload(seed: int, max_new: int = 14, max_total: int | None = None,
             max_model_len: int | None = None) -> list[tuple[int, Request]]:
    """(step to add it at, request). max_new bounds max_tokens (exclusive); with max_total, each request's prompt
    and max_tokens fit in max_total tokens, and its prompt in max_model_len (whose limit may stop it first)."""
    rng = random.Random(seed)
    base = [rng.randrange(1, 40) for _ in range(24)]
    plan = []
    for i in range(rng.randrange(4, 10)):
        prompt = base[:rng.randrange(0, 24)] + [rng.randrange(1, 40) for _ in range(rng.randrange(1, 12))]
        max_tokens = rng.randrange(1, max_new)
        if max_total is not None:
            prompt = prompt[:min(max_model_len or max_total, max_total) - 1]
            max_tokens = min(max_tokens, max_total - len(prompt))
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min(max_tokens, rng.choice([0, 0, 3])),
                                stop_token_ids=rng.choice([[], [], [5]]), ignore_eos=rng.random() < 0.3)
        plan.append((rng.randrange(0, 8), Request(f"r{i}", prompt, params, 0, [EOS], max_tokens)))
    return plan


def token_for(req_id: str, position: int) -> int:
    """The 'sampled' token: a function of the request and position only."""
    return zlib.crc32(f"{req_id}:{position}".encode()) % 12  # small ids: eos (0) and stop token 5 do occur


def sample(out: SchedulerOutput) -> dict[str, int]:
    """The step's sampled tokens, for every chunk that samples."""
    return {q.req_id: token_for(q.req_id, q.start_pos + len(q.token_ids)) for q in out.seqs if q.do_sample}
