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


def wait_idle(url: str, timeout: float = 10.0) -> None:
    """Waits until the engine holds no request and no KV block (read from /metrics)."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = metric_values(httpx.get(url + "/metrics").text)
        keys = ("ember_num_requests_running", "ember_num_requests_waiting", "ember_kv_cache_blocks_used")
        if all(gauges.get(k, 0.0) == 0.0 for k in keys):
            return
        assert time.monotonic() < deadline, f"engine still busy: { {k: gauges.get(k) for k in keys} }"
        time.sleep(0.05)


def metric_values(text: str) -> dict[str, float]:
    """Unlabelled view of a Prometheus exposition: name -> value summed over label sets."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values
