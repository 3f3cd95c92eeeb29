"""Bad requests get a 400 in OpenAI's (or Anthropic's) error shape naming the field; the server keeps serving."""
from __future__ import annotations

import httpx
import pytest

from .conftest import MAX_MODEL_LEN, MODEL_NAME

MSG = [{"role": "user", "content": "hello"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

BAD_REQUESTS = [
    # (path, body, param named in the error or None, words the message must contain)
    (CHAT, {"messages": []}, "messages", "at least 1"),
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "robot"),
    (CHAT, {"messages": "hello"}, "messages", "list"),
    (CHAT, {}, "messages", "required"),
    (CHAT, {"messages": MSG, "temperature": "hot"}, "temperature", "number"),
    (CHAT, {"messages": MSG, "max_tokens": "many"}, "max_tokens", "integer"),
    (CHAT, {"messages": MSG, "stop": 5}, "stop", "string"),
    (CHAT, {"messages": MSG, "stop": ["ok", 3]}, "stop", ""),
    (CHAT, {"messages": MSG, "n": 0}, "n", "greater than or equal to 1"),
    (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "20"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, "top_logprobs", "logprobs"),
    (CHAT, {"messages": MSG, "max_tokens": MAX_MODEL_LEN}, "max_tokens", "context window"),
    (CHAT, {"messages": MSG, "max_tokens": 0}, "max_tokens", ""),
    (CHAT, {"messages": MSG, "temperature": -1}, "temperature", "temperature"),
    (CHAT, {"messages": MSG, "top_p": 0}, "top_p", "top_p"),
    (CHAT, {"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias", "abc"),
    (CHAT, {"messages": MSG, "logit_bias": {"999999": 1}}, "logit_bias", "999999"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", "image_url"),
    (COMPLETIONS, {"prompt": "x " * (MAX_MODEL_LEN + 10)}, "prompt", "context window"),
    (COMPLETIONS, {"prompt": ""}, "prompt", "empty"),
    (COMPLETIONS, {"prompt": []}, "prompt", "empty"),
    (COMPLETIONS, {"prompt": [1, "a"]}, "prompt", ""),
    (COMPLETIONS, {"prompt": [5, 99999]}, "prompt", "vocabulary"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 6}, "logprobs", "5"),
    (COMPLETIONS, {"prompt": "x", "n": -2}, "n", ""),
    (COMPLETIONS, {"prompt": "x", "min_tokens": 10, "max_tokens": 2}, "min_tokens", "min_tokens"),
    (COMPLETIONS, {"prompt": "x", "seed": "s"}, "seed", ""),
]


@pytest.mark.parametrize("path,body,param,words", BAD_REQUESTS)
def test_bad_request_is_400(client, path, body, param, words):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("raw,words", [(b"{", "not valid JSON"), (b'{"messages": [', "not valid JSON"),
                                       (b"[1, 2]", "JSON array"), (b"null", "JSON null"), (b"", "empty"),
                                       (b"\xff\xfe", "not valid JSON")])
def test_malformed_json_is_400(client, raw, words):
    r = client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and words in r.json()["error"]["message"]


def test_json_without_content_type_is_accepted(client):
    # curl -d sends application/x-www-form-urlencoded; llama.cpp's server reads the JSON anyway, so do we
    raw = b'{"prompt": "hi", "max_tokens": 2}'
    r = client.post(COMPLETIONS, content=raw, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text


def test_unknown_model_is_404(client):
    r = client.post(CHAT, json={"model": "gpt-4o", "messages": MSG, "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_unknown_fields_are_ignored(client):
    body = {"model": MODEL_NAME, "messages": MSG, "max_tokens": 2, "parallel_tool_calls": False,
            "service_tier": "auto", "store": False, "metadata": {"a": "b"}, "reasoning_effort": "low"}
    assert client.post(CHAT, json=body).status_code == 200


def test_server_still_answers_after_errors(client):
    for path, body, *_ in BAD_REQUESTS:
        client.post(path, json=body)
    assert client.get("/health").status_code == 200
    r = client.post(COMPLETIONS, json={"prompt": "still here", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_anthropic_errors_in_anthropic_shape(client):
    cases = [({"model": MODEL_NAME, "messages": MSG}, "max_tokens"),
             ({"model": MODEL_NAME, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
             ({"model": MODEL_NAME, "max_tokens": 5, "messages": []}, "messages"),
             ({"model": MODEL_NAME, "max_tokens": 5, "messages": MSG, "stop_sequences": "x"}, "stop_sequences"),
             ({"model": MODEL_NAME, "max_tokens": MAX_MODEL_LEN, "messages": MSG}, "context window")]
    for body, words in cases:
        r = client.post("/v1/messages", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert words in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def keyed(served):
    from ember.server import build_app
    from ember.server.background import ServerThread

    with ServerThread(build_app(served.engine, MODEL_NAME, api_key="sekret")) as server:
        yield server.url


def test_api_key(keyed):
    body = {"messages": MSG, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
        r = httpx.post(keyed + CHAT, json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed + "/v1/models").status_code == 401
    assert httpx.post(keyed + CHAT, json=body, headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert httpx.get(keyed + "/health").status_code == 200 and httpx.get(keyed + "/metrics").status_code == 200
    msg = {"model": MODEL_NAME, "max_tokens": 2, "messages": MSG}
    r = httpx.post(keyed + "/v1/messages", json=msg)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(keyed + "/v1/messages", json=msg, headers={"x-api-key": "sekret"}).status_code == 200


def test_api_key_with_sdks(keyed):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=keyed + "/v1", api_key="sekret")
    assert good.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed + "/v1", api_key="nope").models.list()
    anthropic = pytest.importorskip("anthropic")
    reply = anthropic.Anthropic(base_url=keyed, api_key="sekret").messages.create(
        model=MODEL_NAME, max_tokens=2, messages=MSG)
    assert reply.usage.output_tokens == 2
