"""/v1/messages: the official anthropic client, the event sequence, stop reasons."""
from __future__ import annotations

import json

import pytest

from ember import SamplingParams

from .conftest import MODEL_NAME

SYSTEM = "You answer briefly."
MESSAGES = [{"role": "user", "content": "Where is the bridge?"}]


def expected_text(reference, max_tokens: int) -> str:
    chat = [{"role": "system", "content": SYSTEM}, *MESSAGES]
    return reference.chat(chat, SamplingParams(temperature=0, max_tokens=max_tokens))[0].outputs[0].text


@pytest.fixture
def anthropic_client(served):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=served.url, api_key="unused")


def test_messages_with_anthropic_client(anthropic_client, reference):
    # this SDK has no temperature argument; the fixture model's defaults are greedy, and extra_body reaches us
    reply = anthropic_client.messages.create(model=MODEL_NAME, system=SYSTEM, messages=MESSAGES, max_tokens=10,
                                             extra_body={"temperature": 0, "top_k": 1})
    assert reply.content[0].type == "text" and reply.content[0].text == expected_text(reference, 10)
    assert reply.stop_reason == "max_tokens" and reply.role == "assistant" and reply.model == MODEL_NAME
    assert reply.usage.output_tokens == 10 and reply.usage.input_tokens > 5
    blocks = anthropic_client.messages.create(
        model=MODEL_NAME, system=[{"type": "text", "text": SYSTEM}], max_tokens=10,
        messages=[{"role": "user", "content": [{"type": "text", "text": MESSAGES[0]["content"]}]}])
    assert blocks.content[0].text == reply.content[0].text


def test_messages_stream_with_anthropic_client(anthropic_client, reference):
    with anthropic_client.messages.stream(model=MODEL_NAME, system=SYSTEM, messages=MESSAGES,
                                          max_tokens=12) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == expected_text(reference, 12)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12


def test_messages_event_sequence(client):
    body = {"model": MODEL_NAME, "max_tokens": 5, "messages": MESSAGES, "stream": True, "temperature": 0}
    with client.stream("POST", "/v1/messages", json=body) as r:
        lines = list(r.iter_lines())
    names = [line[7:] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert [d["type"] for d in data] == names
    assert data[-2]["delta"]["stop_reason"] == "max_tokens" and data[-2]["usage"]["output_tokens"] == 5
    assert data[0]["message"]["usage"]["input_tokens"] > 0 and data[0]["message"]["content"] == []


def test_stop_sequence(anthropic_client, reference):
    full = expected_text(reference, 24)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    reply = anthropic_client.messages.create(model=MODEL_NAME, system=SYSTEM, messages=MESSAGES, max_tokens=24,
                                             stop_sequences=[stop])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert reply.content[0].text == full[:full.index(stop)]
