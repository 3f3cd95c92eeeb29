"""Token-budget scheduler (no prefill/decode phases). Each step spends max_num_batched_tokens over running
requests first (decodes and unfinished prefill chunks), then admits waiting ones, reusing cached prefixes.
When the pool runs dry the most recently admitted request is preempted and later recomputed.

A step's bookkeeping has two halves: `advance` once it is launched (computed counts move on, full blocks enter
the prefix cache, each sampling request gets a placeholder token) and `complete` once its tokens are known
(placeholders filled, stops checked, finished requests freed). With async scheduling the engine schedules step
n+1 between the two halves of step n, so a decode may feed a placeholder: the runner takes it from the device
copy of step n's sample."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ember.config import SchedulerConfig
from ember.kv.managers import KVCacheManager
from ember.kv.state_pool import StateStep
from ember.request import PLACEHOLDER_TOKEN_ID, Request, RequestStatus
from ember.sampling_params import SamplingParams

# module constants: looking a member up on its enum class costs ~0.1 us, and these are read per request per step
_FIRST_FINISHED = RequestStatus.FINISHED_STOPPED
_PREEMPTED = RequestStatus.PREEMPTED


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

    @property
    def wants_prompt_logprobs(self) -> bool:
        """This chunk holds prompt positions whose next token's logprobs were asked for: the step needs every row's
        hidden state and reads them to the host."""
        return self.params.prompt_logprobs is not None and self.start_pos < len(self.prompt_token_ids) - 1


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    num_batched_tokens: int
    preempted_req_ids: list[str]

    @property
    def is_empty(self) -> bool:
        return not self.seqs


def _has_penalties(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


def _needs_serial_step(seq: ScheduledSeq) -> bool:
    """Penalties read the request's earlier tokens on the host; prompt logprobs are read to the host in the step."""
    p = seq.params
    return _has_penalties(p) or seq.wants_prompt_logprobs


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager) -> None:
        self.cfg = cfg
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._serial_req_ids: set[str] = set()  # requests whose steps may need the serial order

    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        self.requests[request.req_id] = request
        self.waiting.append(request)
        if _has_penalties(request.params) or request.params.prompt_logprobs is not None:
            self._serial_req_ids.add(request.req_id)

    def can_overlap(self, out: SchedulerOutput) -> bool:
        """False when the step must run in serial order: a request's sampling needs its previous token on the host
        (penalties), or the step computes prompt logprobs (read to the host inside the step)."""
        ids = self._serial_req_ids
        return not ids or not any(_needs_serial_step(s) for s in out.seqs if s.req_id in ids)

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
        i, max_len = 0, self.cfg.max_model_len
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.num_placeholders:
                num_out = len(request.output_token_ids)
                if num_out >= request.max_tokens or num_out + len(request.prompt_token_ids) >= max_len:
                    i += 1  # its last token is in flight and ends it on length: nothing left to compute
                    continue
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
        """Both halves of a step's bookkeeping at once (the serial order). Returns the requests with a new token."""
        self.advance(out)
        return self.complete(out, sampled)

    def advance(self, out: SchedulerOutput) -> None:
        """The step is launched: its chunks count as computed, and each request that samples gets a placeholder
        output token (so lengths, the sampler's counter and stops on length are right before the token is known).
        Full computed blocks enter the prefix cache now: a step that reads them runs after this one on the device."""
        requests, cache_computed = self.requests, self.kv.cache_computed
        for seq in out.seqs:
            request = requests.get(seq.req_id)
            if request is None or request.status >= _FIRST_FINISHED:
                continue  # ended (stop string, abort) since it was scheduled
            request.num_computed_tokens += len(seq.token_ids)
            if seq.do_sample:
                request.output_token_ids.append(PLACEHOLDER_TOKEN_ID)
                request.num_placeholders += 1
            cache_computed(request)

    def complete(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """The advanced step ended: fills its placeholders with the sampled tokens, finishes and frees requests
        that hit a stop condition. Returns the requests that got a new token."""
        updated = []
        requests, num_finished = self.requests, 0
        for seq in out.seqs:
            request = requests.get(seq.req_id)
            output_ids = seq.output_token_ids
            if request is None or request.output_token_ids is not output_ids or request.status >= _FIRST_FINISHED:
                continue  # ended while the step ran (its id may already belong to a new request)
            if not seq.do_sample:
                continue
            token = sampled[seq.req_id]
            assert output_ids[-1] == PLACEHOLDER_TOKEN_ID, "complete() without advance()"
            output_ids[-1] = token
            request.num_placeholders -= 1
            status = request.status
            self._check_stop(request, token)
            updated.append(request)
            if request.status >= _FIRST_FINISHED:
                if status == _PREEMPTED:  # preempted while its last token was in flight
                    self.waiting.remove(request)
                self.kv.free(request)
                del requests[request.req_id]
                self._serial_req_ids.discard(request.req_id)
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
        if request.num_placeholders:  # aborted while its step ran: that token is never sent
            del request.output_token_ids[-request.num_placeholders:]
            request.num_placeholders = 0
        if request in self.waiting:
            self.waiting.remove(request)
        self._remove(request)
        return request

    def _remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        self.kv.free(request)
        self.requests.pop(request.req_id, None)
        self._serial_req_ids.discard(request.req_id)
