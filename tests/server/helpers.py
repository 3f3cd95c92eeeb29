"""Helpers for the server tests: reading SSE streams and Prometheus text."""
from __future__ import annotations

import json
import time

import httpx


def sse_events(response: httpx.Response) -> list[dict]:
    """The JSON payloads of an OpenAI SSE stream, asserting it ends with [DONE]."""
    payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads[:-1]]


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
