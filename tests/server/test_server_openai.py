"""/v1/chat/completions and /v1/completions against a real engine: equal to the offline LLM API, streamed or not."""
from __future__ import annotations

import random

import pytest

from ember import SamplingParams

from .conftest import MODEL_NAME
from .helpers import concurrent_stream_texts, random_jobs, stream_text

CHAT = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Where is the bridge?"}]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_chat_equals_llm_chat(client, reference):
    r = client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 12,
                                                  "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = reference.chat(CHAT, greedy(12))[0]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected.outputs[0].text}
    assert body["choices"][0]["finish_reason"] == expected.outputs[0].finish_reason
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL_NAME and body["system_fingerprint"] and body["created"] > 0
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(expected.prompt_token_ids)
    assert usage["completion_tokens"] == len(expected.outputs[0].token_ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_unset_sampling_fields_take_model_defaults(client, reference):
    # the fixture's generation_config.json says do_sample=false: greedy without asking
    r = client.post("/v1/completions", json={"prompt": "The old mill", "max_tokens": 10})
    expected = reference.generate("The old mill", greedy(10))[0].outputs[0].text
    assert r.json()["choices"][0]["text"] == expected


@pytest.mark.parametrize("prompt", ["The river rose in the spring", [17, 300, 52, 9, 1200]])
def test_completion_equals_llm_generate(client, reference, prompt):
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 9, "temperature": 0})
    assert r.status_code == 200, r.text
    expected = reference.generate(prompt, greedy(9))[0].outputs[0]
    choice = r.json()["choices"][0]
    assert choice["text"] == expected.text and choice["finish_reason"] == "length"
    assert r.json()["object"] == "text_completion" and r.json()["usage"]["completion_tokens"] == 9


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 16, "temperature": 0}),
    ("/v1/completions", {"prompt": "Bread needs flour", "max_tokens": 16, "temperature": 0}),
    ("/v1/completions", {"prompt": "Bread needs flour", "max_tokens": 16, "temperature": 0.9, "seed": 3, "n": 2}),
    ("/v1/completions", {"prompt": ["Bread needs", "Salt"], "max_tokens": 5, "temperature": 0, "echo": True,
                         "logprobs": 1, "stop": "zz"}),
])
def test_stream_equals_non_stream(client, path, body):
    whole = client.post(path, json=body).json()
    texts, chunks = stream_text(client, path, body)
    for choice in whole["choices"]:
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        assert texts[choice["index"]] == text
    finals = [c for chunk in chunks for c in chunk["choices"] if c["finish_reason"] is not None]
    assert sorted(c["index"] for c in finals) == [c["index"] for c in whole["choices"]]
    assert all(chunk["id"] == chunks[0]["id"] for chunk in chunks)


def test_stream_include_usage(client):
    body = {"messages": CHAT, "max_tokens": 5, "temperature": 0, "stream_options": {"include_usage": True}}
    _, chunks = stream_text(client, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(c["usage"] is None for c in chunks[:-1])


def test_n_and_seed_match_llm(client, reference):
    body = {"prompt": "Questions are answered", "max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 3}
    choices = client.post("/v1/completions", json=body).json()["choices"]
    expected = reference.generate("Questions are answered", SamplingParams(temperature=1.0, seed=11, n=3,
                                                                           max_tokens=8))[0]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert [c["text"] for c in choices] == [o.text for o in expected.outputs]
    again = client.post("/v1/completions", json=body).json()["choices"]
    assert [c["text"] for c in again] == [c["text"] for c in choices]


def test_prompt_lists(client, reference):
    prompts = ["The weather today", "A good detective"]
    r = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2})
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):
        expected = reference.generate(prompt, greedy(6))[0].outputs[0].text
        assert choices[2 * i]["text"] == choices[2 * i + 1]["text"] == expected
    tok = reference.get_tokenizer()
    ids = [tok.encode(p) for p in prompts]
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 6, "temperature": 0})
    assert [c["text"] for c in r.json()["choices"]] == [c["text"] for c in choices[::2]]
    assert r.json()["usage"]["prompt_tokens"] == sum(len(i) for i in ids)


def test_stop_string(client, reference):
    full = reference.generate("Numbers count things", greedy(24))[0].outputs[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    body = {"prompt": "Numbers count things", "max_tokens": 24, "temperature": 0, "stop": [stop, "@@@"]}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == full[:full.index(stop)]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    texts, _ = stream_text(client, "/v1/completions", {**body, "stop": stop})
    assert texts[0] == choice["text"]


def test_logit_bias_ignore_eos_and_max_completion_tokens(client, reference):
    body = {"messages": CHAT, "max_completion_tokens": 7, "max_tokens": 50, "temperature": 0,
            "logit_bias": {"1234": 100}, "ignore_eos": True, "min_tokens": 7}
    r = client.post("/v1/chat/completions", json=body).json()
    assert r["usage"]["completion_tokens"] == 7  # max_completion_tokens wins over the legacy max_tokens
    assert r["choices"][0]["message"]["content"] == reference.get_tokenizer().decode([1234]) * 7


def test_chat_logprobs(client):
    body = {"messages": CHAT, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 6 and "".join(e["token"] for e in content) == choice["message"]["content"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 3 and entry["bytes"] == list(entry["token"].encode())
        # greedy: the chosen token is the most likely one
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])
    _, chunks = stream_text(client, "/v1/chat/completions", body)
    streamed = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]


def test_completion_logprobs_with_echo(client, reference):
    prompt = "To make bread"
    n_prompt = len(reference.get_tokenizer().encode(prompt))
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": True}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    lps = choice["logprobs"]
    assert choice["text"].startswith(prompt)
    assert len(lps["tokens"]) == n_prompt + 4 == len(lps["token_logprobs"]) == len(lps["text_offset"])
    assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
    assert all(isinstance(v, float) for v in lps["token_logprobs"][1:])
    assert all(1 <= len(top) <= 3 for top in lps["top_logprobs"][1:])
    assert lps["text_offset"] == sorted(lps["text_offset"]) and lps["text_offset"][0] == 0
    assert "".join(lps["tokens"]) == choice["text"]


def test_concurrent_streams_equal_solo(served, reference):
    jobs = random_jobs(0)
    for (prompt, max_tokens), text in zip(jobs, concurrent_stream_texts(served.url, jobs)):
        assert text == reference.generate(prompt, greedy(max_tokens))[0].outputs[0].text



def test_prefix_cache_hit(client, reference):
    rng = random.Random(1234)
    prefix = [rng.randrange(0, 4000) for _ in range(1000)]
    body = {"max_tokens": 8, "temperature": 0}
    first = client.post("/v1/completions", json={**body, "prompt": prefix + [5, 6, 7]}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = client.post("/v1/completions", json={**body, "prompt": prefix + [8, 9]}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 960
    cold = reference.generate(prefix + [8, 9], greedy(8))[0]
    assert cold.num_cached_tokens == 0
    assert second["choices"][0]["text"] == cold.outputs[0].text


def test_openai_client(served, reference):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    expected = reference.chat(CHAT, greedy(10))[0].outputs[0].text
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=10, temperature=0)
    assert chat.choices[0].message.content == expected and chat.usage.completion_tokens == 10
    stream = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 10
    text = reference.generate("Fishermen pushed", greedy(10))[0].outputs[0].text
    comp = client.completions.create(model=MODEL_NAME, prompt="Fishermen pushed", max_tokens=10, temperature=0,
                                     extra_body={"top_k": 5, "ignore_eos": False})
    assert comp.choices[0].text == text
    pieces = client.completions.create(model=MODEL_NAME, prompt="Fishermen pushed", max_tokens=10, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in pieces) == text


def test_tools_and_chat_template_kwargs_reach_the_template(client, reference):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    history = [*CHAT,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    body = {"messages": history, "tools": tools, "tool_choice": "auto", "max_tokens": 8, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    ids = reference.get_tokenizer().encode_chat(history, tools=tools, enable_thinking=False)
    expected = reference.generate(ids, greedy(8))[0].outputs[0].text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    assert r.json()["choices"][0]["message"]["content"] == expected
    plain = client.post("/v1/chat/completions", json={**body, "tools": None, "chat_template_kwargs": None}).json()
    assert plain["usage"]["prompt_tokens"] < len(ids)


def test_sampling_fields_reach_the_sampler(client, reference):
    fields = dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.01, presence_penalty=0.5, frequency_penalty=0.3,
                  repetition_penalty=1.2, seed=42, min_tokens=3, stop_token_ids=[7])
    r = client.post("/v1/completions", json={"prompt": "Mathematics describes", "max_tokens": 12, **fields})
    expected = reference.generate("Mathematics describes", SamplingParams(max_tokens=12, **fields))[0].outputs[0]
    assert r.json()["choices"][0]["text"] == expected.text
    assert r.json()["usage"]["completion_tokens"] == len(expected.token_ids)
