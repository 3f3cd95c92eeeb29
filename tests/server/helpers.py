"""Helpers for the server tests: reading SSE streams and Prometheus text."""
from __future__ import annotations

import asyncio
import json
import random
import time

import httpx

WORDS = "river bridge town bread water salt fog morning children mill church".split()


def sse_events(response: httpx.Response) -> list[dict]:
    """The JSON payloads of an OpenAI SSE stream, asserting it ends with [DONE]."""
    payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads[:-1]]


def random_jobs(seed: int, n: int = 16) -> list[tuple[str, int]]:
    """n (prompt, max_tokens) pairs: prompts of 3-40 words, 3-30 tokens each."""
    rng = random.Random(seed)
    return [(" ".join(rng.choices(WORDS, k=rng.randint(3, 40))), rng.randint(3, 30)) for _ in range(n)]


def concurrent_stream_texts(url: str, jobs: list[tuple[str, int]]) -> list[str]:
    """Streams every (prompt, max_tokens) greedy /v1/completions request at once; the text of each."""

    async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> str:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = [line async for line in r.aiter_lines()]
        payloads = [line[6:] for line in lines if line.startswith("data: ")]
        assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
        return "".join(c["choices"][0]["text"] for c in map(json.loads, payloads[:-1]) if c["choices"])

    async def main() -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(one(client, p, m) for p, m in jobs))

    return asyncio.run(main())


def stream_text(client: httpx.Client, path: str, body: dict) -> tuple[dict[int, str], list[dict]]:
    """Text per choice index of a streamed request, and the raw chunks."""
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        chunks = sse_events(r)
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = choice["delta"].get("content") if "delta" in choice else choice["text"]
            texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
    return texts, chunks


def engine_gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    names = ("ember_num_requests_running", "ember_num_requests_waiting", "ember_kv_cache_blocks_used")
    return {name: metric(text, name) for name in names}


def wait_idle(url: str, timeout: float = 10.0) -> None:
    """Waits until the engine holds no request and no referenced KV block (read from /metrics)."""
    deadline = time.monotonic() + timeout
    while any(engine_gauges(url).values()):
        assert time.monotonic() < deadline, f"engine still busy: {engine_gauges(url)}"
        time.sleep(0.05)


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition, summed over the label sets that contain `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        sample, _, label_text = name_labels.partition("{")
        if sample == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total
