"""What the API dialects share: sampling params from a request, the n-way fan-out into engine requests,
usage accounting, and cancelling work whose client went away."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, TypeVar

from fastapi import Request
from fastapi.responses import Response

from ember import __version__
from ember.engine.async_engine import AsyncEngine
from ember.engine.outputs import RequestDelta
from ember.llm import child_params
from ember.sampling_params import SamplingParams
from ember.server.errors import ApiError
from ember.server.metrics import ServerMetrics
from ember.server.protocol import PromptTokensDetails, SamplingFields, Usage

if TYPE_CHECKING:
    from ember.engine.core import EngineCore
    from ember.tokenizer.tokenizer import Tokenizer

T = TypeVar("T")
# request fields copied into SamplingParams only when the client set them (else the model's defaults hold)
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "seed")


@dataclass(slots=True)
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))
    fingerprint: str = f"fp_ember_{__version__}"

    @property
    def core(self) -> "EngineCore":
        return self.engine.core

    @property
    def tokenizer(self) -> "Tokenizer":
        if self.core.tokenizer is None:
            raise ApiError("this model has no tokenizer.json, so it takes token-id prompts only "
                           "(POST /v1/completions with a list of ints)", 400, "prompt")
        return self.core.tokenizer

    def check_request(self, model: str | None) -> None:
        """The model name (when given) must be ours, and the engine must be up."""
        if model is not None and model != self.model_name:
            raise ApiError(f"the model `{model}` does not exist; this server serves `{self.model_name}`",
                           404, "model", "model_not_found")
        if not self.engine.is_running:
            raise ApiError("the engine is not running (shutting down or failed); retry later", 503)


def parse_logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    parsed = {}
    for key, value in bias.items():
        try:
            parsed[int(key)] = value
        except ValueError:
            raise ApiError(f"logit_bias keys must be token ids as strings (e.g. \"50256\"), got {key!r}",
                           400, "logit_bias") from None
    return parsed


def build_params(state: ServerState, body: SamplingFields, **fields: Any) -> SamplingParams:
    """The model's default SamplingParams with every field the client set applied, validated."""
    overrides = {name: getattr(body, name) for name in _OPTIONAL_FIELDS if getattr(body, name) is not None}
    overrides.update(n=body.n, stop=body.stop or [], stop_token_ids=body.stop_token_ids or [],
                     ignore_eos=body.ignore_eos, min_tokens=body.min_tokens,
                     skip_special_tokens=body.skip_special_tokens,
                     include_stop_str_in_output=body.include_stop_str_in_output,
                     logit_bias=parse_logit_bias(body.logit_bias), **fields)
    return replace_params(state.core.default_sampling_params(), **overrides)


def replace_params(base: SamplingParams, **overrides: Any) -> SamplingParams:
    try:
        return base.replace(**overrides)
    except ValueError as e:
        name = str(e).split(" ", 1)[0]
        raise ApiError(str(e), 400, name if name in overrides else None) from None


def validate_prompts(state: ServerState, prompts: list[list[int]], params: SamplingParams) -> None:
    """Runs the engine's checks up front, so a bad request is a 400 before any stream starts."""
    for i, ids in enumerate(prompts):
        try:
            state.core.validate(ids, params)
        except ValueError as e:
            where = f"prompt {i}: " if len(prompts) > 1 else ""
            raise ApiError(where + str(e), 400, _param_of(str(e))) from None


def _param_of(message: str) -> str:
    """The request field an engine validation message is about."""
    for name in ("logit_bias", "stop_token_ids"):
        if message.startswith(name):
            return name
    return "max_tokens" if "max_tokens" in message else "prompt"


@dataclass(slots=True)
class UsageCounter:
    """Token counts of a request fanned out to len(prompt_lens) * n engine requests."""

    prompt_lens: list[int]
    n: int
    num_completion_tokens: int = 0
    cached: dict[int, int] = field(default_factory=dict)

    def add(self, index: int, delta: RequestDelta) -> None:
        self.num_completion_tokens += len(delta.new_token_ids)
        # siblings share the prompt: count its cache hit once; abort deltas carry no counts
        if index % self.n == 0 and delta.num_prompt_tokens:
            self.cached[index // self.n] = delta.num_cached_tokens

    def usage(self) -> Usage:
        num_prompt = sum(self.prompt_lens)
        return Usage(prompt_tokens=num_prompt, completion_tokens=self.num_completion_tokens,
                     total_tokens=num_prompt + self.num_completion_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(self.cached.values())))


async def stream_choices(state: ServerState, base_id: str, prompts: list[list[int]],
                         params: SamplingParams) -> AsyncIterator[tuple[int, RequestDelta]]:
    """Yields (choice index, delta) from n engine requests per prompt; choice index = prompt * n + sample.

    Closing or cancelling this generator (client gone) cancels every child, which aborts its engine request.
    """
    if len(prompts) == 1 and params.n == 1:  # the common case needs no fan-in: one hop less per token
        async for delta in _tracked(state, f"{base_id}-0", prompts[0], child_params(params, 0)):
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()
    tasks = []
    for p, ids in enumerate(prompts):
        for i in range(params.n):
            req_id = f"{base_id}-{i}" if len(prompts) == 1 else f"{base_id}-{p}-{i}"
            job = _pump(state, req_id, ids, child_params(params, i), p * params.n + i, queue)
            tasks.append(asyncio.create_task(job))
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                remaining -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()  # each task's finally (in AsyncEngine.generate) aborts its engine request


async def _pump(state: ServerState, req_id: str, ids: list[int], params: SamplingParams, index: int,
                queue: asyncio.Queue) -> None:
    try:
        async for delta in _tracked(state, req_id, ids, params):
            queue.put_nowait((index, delta))
        queue.put_nowait((index, None))
    except Exception as e:  # noqa: BLE001 - handed to the consumer, which answers the client
        queue.put_nowait((index, e))


async def _tracked(state: ServerState, req_id: str, ids: list[int],
                   params: SamplingParams) -> AsyncIterator[RequestDelta]:
    """One engine request's deltas, timed for /metrics."""
    tracker = state.metrics.track()
    stream = state.engine.generate(req_id, ids, params)
    try:
        async for delta in stream:
            tracker.observe(delta)
            yield delta
    finally:
        await stream.aclose()  # now, not at garbage collection: this is what aborts the engine request
        tracker.done("abort")  # no-op when the request already finished


def engine_error(e: Exception) -> ApiError:
    """An exception out of the engine, as the client should see it."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ValueError):
        return ApiError(str(e), 400)
    return ApiError(f"the engine failed: {e}", 500)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | Response:
    """Runs `work` unless the client disconnects first; then cancels it (freeing its engine requests)."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    return Response(status_code=499)  # nobody is listening; nginx's "client closed request"


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
