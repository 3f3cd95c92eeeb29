"""Load, client disconnects, /health, /metrics, and `ember serve` shutting down cleanly on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from ember.cli.bench import BenchConfig, random_requests, run_benchmark

from .conftest import MODEL_NAME
from .helpers import engine_gauges, metric, wait_idle

LONG = {"prompt": "The small town sat at the edge of a wide river", "max_tokens": 1900, "ignore_eos": True,
        "temperature": 0}


def aborted(url: str) -> float:
    return metric(httpx.get(url + "/metrics").text, "ember_request_success_total", finished_reason="abort")


def test_health_and_models(client):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL_NAME


def test_load_64_requests_at_concurrency_16(served):
    wait_idle(served.url)
    before = httpx.get(served.url + "/metrics").text
    cfg = BenchConfig(served.url, concurrency=16, timeout=60)
    summary = run_benchmark(cfg, random_requests(64, input_len=24, output_len=12, seed=5))
    assert summary.num_ok == 64, summary.errors
    assert summary.output_tokens == 64 * 12 and cfg.model == MODEL_NAME
    assert 0 < summary.ttft_ms["p50"] <= summary.e2e_ms["p50"]
    after = httpx.get(served.url + "/metrics").text
    done = "ember_request_success_total"
    assert metric(after, done, finished_reason="length") - metric(before, done, finished_reason="length") == 64
    assert metric(after, "ember_generation_tokens_total") - metric(before, "ember_generation_tokens_total") == 768
    ttft = "ember_time_to_first_token_seconds_count"
    assert metric(after, ttft) - metric(before, ttft) == 64
    assert metric(after, "ember_kv_cache_blocks_total") > 0
    wait_idle(served.url)


def test_closed_streams_free_their_blocks(served):
    wait_idle(served.url)
    num_aborted = aborted(served.url)
    clients = [httpx.Client(base_url=served.url, timeout=30) for _ in range(4)]
    streams = [c.stream("POST", "/v1/completions", json={**LONG, "stream": True}) for c in clients]
    readers = [stream.__enter__().iter_lines() for stream in streams]  # kept: a dropped reader hangs up
    for lines in readers:
        assert next(line for line in lines if line.startswith("data: "))
    busy = engine_gauges(served.url)
    assert busy["ember_num_requests_running"] == 4 and busy["ember_kv_cache_blocks_used"] > 0
    for stream, c in zip(streams, clients):
        stream.__exit__(None, None, None)
        c.close()
    wait_idle(served.url)
    assert aborted(served.url) - num_aborted == 4


def test_killed_client_process_frees_its_blocks(served):
    wait_idle(served.url)
    num_aborted = aborted(served.url)
    script = textwrap.dedent(f"""
        import httpx, sys
        with httpx.stream("POST", "{served.url}/v1/chat/completions", timeout=30, json={{
                "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 1900, "ignore_eos": True,
                "stream": True}}) as r:
            lines = r.iter_lines()  # kept: a dropped reader would hang up before the kill
            for line in lines:
                if '"content"' in line:
                    print("streaming", flush=True)
                    break
            sys.stdin.read()  # hold the connection until killed
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming"
        assert engine_gauges(served.url)["ember_num_requests_running"] == 1
    finally:
        proc.kill()
        proc.wait()
    wait_idle(served.url)
    assert aborted(served.url) - num_aborted == 1


def test_non_streaming_client_timeout_aborts(served):
    wait_idle(served.url)
    num_aborted = aborted(served.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.url + "/v1/completions", json={**LONG, "max_tokens": 1990, "n": 2}, timeout=0.3)
    wait_idle(served.url)
    assert aborted(served.url) - num_aborted == 2


def test_health_503_when_engine_stopped(served):
    from ember.engine.async_engine import AsyncEngine
    from ember.server import build_app
    from ember.server.background import ServerThread

    stopped = AsyncEngine(served.engine.core)  # never started: its thread is not alive
    with ServerThread(build_app(stopped, MODEL_NAME)) as server:
        assert httpx.get(server.url + "/health").status_code == 503
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and "not running" in r.json()["error"]["message"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_cli_drains_and_exits_0_on_sigterm(model_dir):
    port = _free_port()
    cmd = [sys.executable, "-m", "ember.cli.serve", str(model_dir), "--port", str(port), "--device", "cpu",
           "--kv-cache-gb", "0.05", "--shutdown-timeout", "0.5", "--served-model-name", "cli", "--log-level",
           "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "ember serve did not come up"
                time.sleep(0.2)
        body = {**LONG, "model": "cli", "stream": True, "max_tokens": 2000}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]"
        assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "abort"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
