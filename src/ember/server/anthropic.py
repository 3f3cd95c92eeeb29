"""POST /v1/messages: Anthropic's Messages API (text content), streamed with Anthropic's event sequence.

Events: message_start, content_block_start, ping, content_block_delta (text_delta)..., content_block_stop,
message_delta (stop_reason, usage), message_stop. Errors use Anthropic's {"type": "error", ...} shape.
"""
from __future__ import annotations

import json
import uuid
from contextlib import aclosing
from typing import AsyncIterator

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ember.engine.outputs import CompletionOutput
from ember.sampling_params import SamplingParams
from ember.server.errors import ApiError, anthropic_error_body, parse_body
from ember.server.generation import (ServerState, UsageCounter, engine_error, replace_params, stream_choices,
                                     until_disconnect, validate_prompts)
from ember.server.protocol import AnthropicBlock, AnthropicUsage, MessagesRequest, MessagesResponse

router = APIRouter()


def _text(content: str | list[AnthropicBlock], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for block in content:
        if block.type != "text" or block.text is None:
            raise ApiError(f"{where}: content block type {block.type!r} is not supported; this server takes "
                           "text blocks only", 400, where)
        texts.append(block.text)
    return "".join(texts)


def encode_messages(state: ServerState, body: MessagesRequest) -> list[int]:
    messages = []
    if body.system:
        messages.append({"role": "system", "content": _text(body.system, "system")})
    for i, message in enumerate(body.messages):
        messages.append({"role": message.role, "content": _text(message.content, f"messages.{i}.content")})
    # Anthropic's tool schema, in the OpenAI function shape chat templates expect
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}}
             for t in body.tools] if body.tools else None
    try:
        return state.tokenizer.encode_chat(messages, tools=tools, add_generation_prompt=True)
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        raise ApiError(f"the chat template could not render these messages: {e}", 400, "messages") from None


def messages_params(state: ServerState, body: MessagesRequest) -> SamplingParams:
    overrides = {k: v for k, v in dict(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k).items()
                 if v is not None}
    return replace_params(state.core.default_sampling_params(), n=1, max_tokens=body.max_tokens,
                          stop=body.stop_sequences or [], **overrides)


def stop_reason(output: CompletionOutput, body: MessagesRequest) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for an engine finish."""
    if output.finish_reason == "length":
        return "max_tokens", None
    if isinstance(output.stop_reason, str) and output.stop_reason in (body.stop_sequences or []):
        return "stop_sequence", output.stop_reason
    return "end_turn", None


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    body = await parse_body(request, MessagesRequest)
    state = request.app.state.ember
    state.check_request(body.model)
    prompt_ids = encode_messages(state, body)
    params = messages_params(state, body)
    validate_prompts(state, [prompt_ids], params)
    msg_id = f"msg_{uuid.uuid4().hex}"
    usage = UsageCounter([len(prompt_ids)], 1)
    stream = stream_choices(state, msg_id, [prompt_ids], params)
    if body.stream:
        return StreamingResponse(_events(state, body, msg_id, stream, usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await until_disconnect(request, _response(state, body, msg_id, stream, usage))


async def _response(state: ServerState, body: MessagesRequest, msg_id: str, stream: AsyncIterator,
                    usage: UsageCounter) -> MessagesResponse:
    output = CompletionOutput(0)
    async with aclosing(stream) as deltas:
        try:
            async for index, delta in deltas:
                output.apply(delta)
                usage.add(index, delta)
        except Exception as e:  # noqa: BLE001 - mapped onto a status code for the client
            raise engine_error(e) from e
    reason, sequence = stop_reason(output, body)
    counts = usage.usage()
    return MessagesResponse(id=msg_id, model=body.model, content=[{"type": "text", "text": output.text}],
                            stop_reason=reason, stop_sequence=sequence,
                            usage=AnthropicUsage(input_tokens=counts.prompt_tokens,
                                                 output_tokens=counts.completion_tokens,
                                                 cache_read_input_tokens=counts.prompt_tokens_details.cached_tokens))


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def _events(state: ServerState, body: MessagesRequest, msg_id: str, stream: AsyncIterator,
                  usage: UsageCounter) -> AsyncIterator[str]:
    message = MessagesResponse(id=msg_id, model=body.model, content=[],
                               usage=AnthropicUsage(input_tokens=sum(usage.prompt_lens), output_tokens=0))
    yield event("message_start", {"type": "message_start", "message": message.model_dump()})
    yield event("content_block_start", {"type": "content_block_start", "index": 0,
                                        "content_block": {"type": "text", "text": ""}})
    yield event("ping", {"type": "ping"})
    output = CompletionOutput(0)
    async with aclosing(stream) as deltas:
        try:
            async for index, delta in deltas:
                output.apply(delta)
                usage.add(index, delta)
                if delta.new_text:
                    yield event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                        "delta": {"type": "text_delta", "text": delta.new_text}})
        except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, as Anthropic does
            error = engine_error(e)
            yield event("error", anthropic_error_body(error.message, error.status))
            return
    yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
    reason, sequence = stop_reason(output, body)
    yield event("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                  "usage": {"output_tokens": usage.num_completion_tokens}})
    yield event("message_stop", {"type": "message_stop"})
