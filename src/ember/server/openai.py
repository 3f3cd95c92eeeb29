"""POST /v1/chat/completions and /v1/completions, streamed (SSE) or not, in OpenAI's (and vLLM's) shapes."""
from __future__ import annotations

import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ember.engine.outputs import CompletionOutput
from ember.sampling_params import SamplingParams
from ember.server import logprobs as lp
from ember.server.errors import ApiError, parse_body, sse_error
from ember.server.generation import (ServerState, UsageCounter, build_params, engine_error, stream_choices,
                                     until_disconnect, validate_prompts)
from ember.server.protocol import (AssistantMessage, ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                                   ChatCompletionResponse, ChatMessage, ChatStreamChoice, CompletionChoice,
                                   CompletionRequest, CompletionResponse)

router = APIRouter()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def get_state(request: Request) -> ServerState:
    return request.app.state.ember


def sse(payload: Any) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


# ---- chat -----------------------------------------------------------------------------------------------


def _text_content(message: ChatMessage, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise ApiError(f"messages[{index}].content: content part type {part.type!r} is not supported; "
                           "this server takes text parts only", 400, f"messages[{index}].content")
        texts.append(part.text)
    return "\n".join(texts)


def encode_chat(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    messages = []
    for i, message in enumerate(body.messages):
        entry = message.model_dump(exclude_none=True)
        entry["content"] = _text_content(message, i)
        messages.append(entry)
    kwargs = dict(body.chat_template_kwargs or {})
    if body.tool_choice is not None:
        kwargs.setdefault("tool_choice", body.tool_choice)
    try:
        return state.tokenizer.encode_chat(messages, tools=body.tools,
                                           add_generation_prompt=body.add_generation_prompt, **kwargs)
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        raise ApiError(f"the chat template could not render these messages: {e}", 400, "messages") from None


def chat_params(state: ServerState, body: ChatCompletionRequest) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError("top_logprobs needs logprobs=true", 400, "top_logprobs")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return build_params(state, body, max_tokens=max_tokens, logprobs=logprobs)


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    state = get_state(request)
    state.check_request(body.model)
    prompt_ids = encode_chat(state, body)
    params = chat_params(state, body)
    validate_prompts(state, [prompt_ids], params)
    req_id = f"chatcmpl-{uuid.uuid4().hex}"
    usage = UsageCounter([len(prompt_ids)], params.n)
    stream = stream_choices(state, req_id, [prompt_ids], params)
    if body.stream:
        return StreamingResponse(_chat_events(state, body, req_id, stream, usage), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    return await until_disconnect(request, _chat_response(state, body, req_id, stream, usage))


async def _collect(stream: AsyncIterator, outputs: list[CompletionOutput], usage: UsageCounter,
                   prompt_logprobs: dict[int, list] | None = None) -> None:
    async with aclosing(stream) as deltas:
        try:
            async for index, delta in deltas:
                outputs[index].apply(delta)
                usage.add(index, delta)
                if prompt_logprobs is not None and delta.prompt_logprobs is not None:
                    prompt_logprobs[index] = delta.prompt_logprobs
        except Exception as e:  # noqa: BLE001 - mapped onto a status code for the client
            raise engine_error(e) from e


async def _chat_response(state: ServerState, body: ChatCompletionRequest, req_id: str, stream: AsyncIterator,
                         usage: UsageCounter) -> ChatCompletionResponse:
    outputs = [CompletionOutput(i) for i in range(body.n)]
    await _collect(stream, outputs, usage)
    top_k = body.top_logprobs or 0
    choices = [ChatChoice(index=o.index, message=AssistantMessage(content=o.text),
                          logprobs=lp.chat_logprobs(o.logprobs or [], top_k) if body.logprobs else None,
                          finish_reason=o.finish_reason, stop_reason=o.stop_reason) for o in outputs]
    return ChatCompletionResponse(id=req_id, model=state.model_name, system_fingerprint=state.fingerprint,
                                  choices=choices, usage=usage.usage())


async def _chat_events(state: ServerState, body: ChatCompletionRequest, req_id: str, stream: AsyncIterator,
                       usage: UsageCounter) -> AsyncIterator[str]:
    header = ChatCompletionChunk(id=req_id, model=state.model_name, system_fingerprint=state.fingerprint,
                                 choices=[])

    def chunk(choice: ChatStreamChoice) -> ChatCompletionChunk:
        return header.model_copy(update={"choices": [choice]})

    for i in range(body.n):
        yield sse(chunk(ChatStreamChoice(index=i, delta={"role": "assistant", "content": ""})))

    def render(index: int, delta) -> ChatCompletionChunk | None:
        logprobs = (lp.chat_logprobs(delta.new_logprobs, body.top_logprobs or 0)
                    if body.logprobs and delta.new_logprobs else None)
        if not (delta.new_text or logprobs or delta.finished):
            return None  # text held back while it may still become a stop string
        content = {"content": delta.new_text} if delta.new_text or logprobs else {}
        return chunk(ChatStreamChoice(index=index, delta=content, logprobs=logprobs,
                                      finish_reason=delta.finish_reason))

    async for line in _sse_stream(stream, usage, body.include_usage, header, render):
        yield line


async def _sse_stream(stream: AsyncIterator, usage: UsageCounter, include_usage: bool, header, render):
    """The SSE body both OpenAI endpoints share: a chunk per delta that `render` turns into one (None skips
    it), an in-band error once the stream has started, the optional usage chunk, then [DONE]."""
    async with aclosing(stream) as deltas:
        try:
            async for index, delta in deltas:
                usage.add(index, delta)
                out = render(index, delta)
                if out is not None:
                    yield sse(out)
        except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, as vLLM does
            error = engine_error(e)
            yield sse_error(error.message, error.status)
    if include_usage:
        yield sse(header.model_copy(update={"usage": usage.usage()}))
    yield "data: [DONE]\n\n"


# ---- completions ----------------------------------------------------------------------------------------


def completion_prompts(state: ServerState, prompt: str | list) -> tuple[list[list[int]], list[str]]:
    """Token ids and text of each prompt: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise ApiError("prompt must not be empty", 400, "prompt")
    if all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    ids = [state.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]
    texts = [p if isinstance(p, str) else _decode(state, p) for p in prompt]
    return ids, texts


def _decode(state: ServerState, ids: list[int]) -> str:
    tokenizer = state.core.tokenizer
    if tokenizer is None:
        return ""
    try:
        return tokenizer.decode(ids, skip_special_tokens=False)
    except Exception:  # noqa: BLE001 - out-of-vocab ids are reported by the engine's validation
        return ""


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    state = get_state(request)
    state.check_request(body.model)
    if body.suffix:
        raise ApiError("suffix is not supported", 400, "suffix")
    prompts, texts = completion_prompts(state, body.prompt)
    echo_logprobs = body.logprobs if body.echo else None
    params = build_params(state, body, max_tokens=body.max_tokens, logprobs=body.logprobs,
                          prompt_logprobs=echo_logprobs)
    validate_prompts(state, prompts, params)
    req_id = f"cmpl-{uuid.uuid4().hex}"
    usage = UsageCounter([len(p) for p in prompts], params.n)
    stream = stream_choices(state, req_id, prompts, params)
    if body.stream:
        events = _completion_events(state, body, req_id, stream, usage, prompts, texts)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    return await until_disconnect(request, _completion_response(state, body, req_id, stream, usage, prompts, texts))


async def _completion_response(state: ServerState, body: CompletionRequest, req_id: str, stream: AsyncIterator,
                               usage: UsageCounter, prompts: list[list[int]], texts: list[str]) -> CompletionResponse:
    outputs = [CompletionOutput(i) for i in range(len(prompts) * body.n)]
    prompt_logprobs: dict[int, list] = {}
    await _collect(stream, outputs, usage, prompt_logprobs)
    choices = []
    for o in outputs:
        p = o.index // body.n
        logprobs = None
        if body.logprobs is not None:
            builder, parts = lp.CompletionLogprobsBuilder(), []
            if body.echo:
                parts.append(builder.prompt(prompts[p], prompt_logprobs.get(o.index), _token_decoder(state)))
            parts.append(builder.output(o.token_ids, o.logprobs or []))
            logprobs = lp.merge(parts)
        text = (texts[p] if body.echo else "") + o.text
        choices.append(CompletionChoice(index=o.index, text=text, logprobs=logprobs, finish_reason=o.finish_reason,
                                        stop_reason=o.stop_reason))
    return CompletionResponse(id=req_id, model=state.model_name, system_fingerprint=state.fingerprint,
                              choices=choices, usage=usage.usage())


def _token_decoder(state: ServerState):
    return lambda token_id: _decode(state, [token_id])


async def _completion_events(state: ServerState, body: CompletionRequest, req_id: str, stream: AsyncIterator,
                             usage: UsageCounter, prompts: list[list[int]], texts: list[str]) -> AsyncIterator[str]:
    header = CompletionResponse(id=req_id, model=state.model_name, system_fingerprint=state.fingerprint, choices=[])
    builders = [lp.CompletionLogprobsBuilder() for _ in range(len(prompts) * body.n)]
    echoed: set[int] = set()
    def render(index: int, delta) -> CompletionResponse | None:
        p, parts, text = index // body.n, [], delta.new_text
        if body.echo and index not in echoed:
            echoed.add(index)
            text = texts[p] + text
            if body.logprobs is not None:
                parts.append(builders[index].prompt(prompts[p], delta.prompt_logprobs, _token_decoder(state)))
        if body.logprobs is not None and delta.new_logprobs:
            parts.append(builders[index].output(delta.new_token_ids, delta.new_logprobs))
        if not (text or parts or delta.finished):
            return None
        choice = CompletionChoice(index=index, text=text, logprobs=lp.merge(parts) if parts else None,
                                  finish_reason=delta.finish_reason, stop_reason=delta.stop_reason)
        return header.model_copy(update={"choices": [choice]})

    async for line in _sse_stream(stream, usage, body.include_usage, header, render):
        yield line
