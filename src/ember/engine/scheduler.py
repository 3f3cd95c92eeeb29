"""Token-budget scheduler (no prefill/decode phases). Each step spends max_num_batched_tokens over running
requests first (decodes and unfinished prefill chunks), then admits waiting ones, reusing cached prefixes.
When the pool runs dry the most recently admitted request is preempted and later recomputed."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ember.config import SchedulerConfig
from ember.kv.managers import KVCacheManager
from ember.kv.state_pool import StateStep
from ember.request import Request, RequestStatus
from ember.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledSeq:
    """What the runner needs to compute one request's chunk this step; read-only for the runner. Not frozen:
    a frozen dataclass's __init__ costs ~0.8 us more, paid for every running request on every step."""

    req_id: str
    token_ids: list[int]  # tokens to feed, positions start_pos .. start_pos + len - 1
    start_pos: int
    block_ids: list[int]
    do_sample: bool  # the chunk reaches the end of the known tokens
    params: SamplingParams
    seed: int
    prompt_token_ids: list[int]  # shared references: read-only for the runner
    output_token_ids: list[int]
    eos_token_ids: list[int]
    state: StateStep | None = None  # recurrent-state slots (hybrid models only)
    group_block_ids: list[list[int]] | None = None  # block tables of KV groups after the first (sliding windows)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    num_batched_tokens: int
    preempted_req_ids: list[str]

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager) -> None:
        self.cfg = cfg
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}

    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        self.requests[request.req_id] = request
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.cfg.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[str] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted:
            budget = self._schedule_waiting(budget, scheduled)
        seqs = [self._make_seq(req, n) for req, n in scheduled]
        return SchedulerOutput(seqs, self.cfg.max_num_batched_tokens - budget, preempted)

    def _chunk(self, request: Request, budget: int) -> int:
        n = min(request.num_tokens - request.num_computed_tokens, budget)
        if self.cfg.long_prefill_token_threshold > 0:
            n = min(n, self.cfg.long_prefill_token_threshold)
        return n

    def _schedule_running(self, budget: int, scheduled: list, preempted: list[str]) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = self._chunk(request, budget)
            while not self.kv.allocate(request, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is request:
                    break
            else:
                scheduled.append((request, n))
                budget -= n
                i += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: list) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            request = self.waiting[0]
            cached = self.kv.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
            num_cached = len(cached) * self.kv.block_size
            n = min(request.num_tokens - request.num_computed_tokens - num_cached, budget)
            if self.cfg.long_prefill_token_threshold > 0:
                n = min(n, self.cfg.long_prefill_token_threshold)
            if not self.kv.allocate(request, n, cached):
                break
            self.waiting.popleft()
            request.num_computed_tokens += num_cached
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append((request, n))
            budget -= n
        return budget

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _make_seq(self, request: Request, n: int) -> ScheduledSeq:
        start, end = request.num_computed_tokens, request.num_computed_tokens + n
        return ScheduledSeq(
            request.req_id, request.token_slice(start, end), start, request.block_ids,
            end == len(request.prompt_token_ids) + len(request.output_token_ids), request.params, request.seed,
            request.prompt_token_ids, request.output_token_ids, request.eos_token_ids,
            self.kv.plan_state(request, n), request.group_block_ids or None,
        )

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Advances computed counts, appends sampled tokens, finishes requests that hit a stop condition.
        Returns the requests that got a new token."""
        updated = []
        num_finished = 0
        for seq in out.seqs:
            request = self.requests.get(seq.req_id)
            if request is None or request.is_finished:
                continue  # aborted while the step ran
            request.num_computed_tokens += len(seq.token_ids)
            token = sampled.get(seq.req_id)
            if token is not None:
                request.output_token_ids.append(token)
                self._check_stop(request, token)
                updated.append(request)
            self.kv.cache_computed(request)
            if request.is_finished:
                self.kv.free(request)
                del self.requests[request.req_id]
                num_finished += 1
        if num_finished:  # one pass, not a list.remove per finished request
            self.running[:] = [r for r in self.running if not r.is_finished]
        return updated

    def _check_stop(self, request: Request, token: int) -> None:
        params, num_out = request.params, len(request.output_token_ids)
        if num_out >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                return
            if token in params.stop_token_ids:
                request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, token
                return
        if num_out >= request.max_tokens or len(request.prompt_token_ids) + num_out >= self.cfg.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH

    def finish(self, req_id: str, status: RequestStatus, stop_reason: int | str | None = None) -> Request | None:
        """Ends a request from outside the step (abort, stop string). Its blocks are freed at once."""
        request = self.requests.get(req_id)
        if request is None or request.is_finished:
            return None
        request.status = status
        if stop_reason is not None:
            request.stop_reason = stop_reason
        if request in self.waiting:
            self.waiting.remove(request)
        self._remove(request)
        return request

    def _remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        self.kv.free(request)
        self.requests.pop(request.req_id, None)
