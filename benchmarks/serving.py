"""Serving benchmark over HTTP against an in-process `ember` server.

1. Continuous batching: the same N requests sent all at once vs one after another; prints the wall-time ratio.
2. Prefix caching: TTFT of a request whose long prefix is cached (hit) vs one whose prefix is new (miss).

    python benchmarks/serving.py [MODEL_DIR] [--device cpu] [--num-requests 16] [--prefix-len 1000]

MODEL_DIR defaults to the built-in demo model. The load generator runs in a child process so that its own
Python work does not compete with the server for the GIL. Not a test: numbers depend on the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import httpx

from ember.cli.bench import BenchConfig, format_summary, random_requests, run_benchmark


def start_server(args: argparse.Namespace):
    from ember import LLM
    from ember.engine.async_engine import AsyncEngine
    from ember.server import build_app
    from ember.server.background import ServerThread

    llm = LLM(args.model, dtype=args.dtype, device=args.device, kv_cache_gb=args.kv_cache_gb,
              max_num_seqs=max(args.num_requests, 16), progress=False)
    engine = AsyncEngine(llm.engine).start()
    return engine, ServerThread(build_app(engine, "bench")).start()


def batching(client: ProcessPoolExecutor, url: str, args: argparse.Namespace) -> dict:
    requests = random_requests(args.num_requests, args.input_len, args.output_len, seed=1)
    client.submit(run_benchmark, BenchConfig(url, concurrency=4), requests[:4]).result()  # warm-up
    concurrent = client.submit(run_benchmark, BenchConfig(url, concurrency=args.num_requests), requests).result()
    sequential = client.submit(run_benchmark, BenchConfig(url, concurrency=1), requests).result()
    for summary in (sequential, concurrent):
        print(format_summary(summary))
    ratio = sequential.duration_s / concurrent.duration_s
    print(f"continuous batching: {args.num_requests} requests x {args.output_len} tokens: "
          f"sequential {sequential.duration_s:.2f}s ({sequential.output_tok_s:.0f} tok/s), "
          f"concurrent {concurrent.duration_s:.2f}s ({concurrent.output_tok_s:.0f} tok/s) -> {ratio:.2f}x")
    return {"sequential_s": sequential.duration_s, "concurrent_s": concurrent.duration_s, "speedup": ratio,
            "sequential_tok_s": sequential.output_tok_s, "concurrent_tok_s": concurrent.output_tok_s}


async def ttft(client: httpx.AsyncClient, prompt: str) -> tuple[float, int]:
    """(seconds to the first streamed token, cached prompt tokens) of a one-token completion."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, cached = time.perf_counter(), None, -1
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and first is None:
                first = time.perf_counter() - start
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None, "the stream carried no token"
    return first, cached


def prefix_cache(url: str, args: argparse.Namespace) -> dict:
    return asyncio.run(_prefix_cache(url, args))


async def _prefix_cache(url: str, args: argparse.Namespace) -> dict:
    words = "river bridge town bread water salt fog morning children mill church field sheep hill".split()
    misses, hits, num_cached = [], [], []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await ttft(client, "warm up")
        for trial in range(args.trials):
            rng = random.Random(trial)
            prefix = " ".join(rng.choices(words, k=args.prefix_len))  # new per trial: the first use misses
            miss, _ = await ttft(client, f"{prefix} first question")
            hit, cached = await ttft(client, f"{prefix} second question")
            misses.append(miss)
            hits.append(hit)
            num_cached.append(cached)
    miss_ms, hit_ms = statistics.median(misses) * 1e3, statistics.median(hits) * 1e3
    print(f"prefix cache: {args.prefix_len}-word prefix, median of {args.trials}: TTFT miss {miss_ms:.1f} ms, "
          f"hit {hit_ms:.1f} ms ({min(num_cached)}+ cached tokens) -> {miss_ms / hit_ms:.2f}x faster")
    return {"ttft_miss_ms": miss_ms, "ttft_hit_ms": hit_ms, "speedup": miss_ms / hit_ms,
            "min_cached_tokens": min(num_cached)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default=None, help="model directory (default: the demo model)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-gb", type=float, default=None)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--prefix-len", type=int, default=1000)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--result-json", default=None)
    args = p.parse_args()
    if args.model is None:
        from ember.demo import demo_model_dir
        args.model = str(demo_model_dir())
    engine, server = start_server(args)
    try:
        print(f"model {args.model} on {engine.core.model_cfg.device} ({engine.core.model_cfg.dtype})")
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as client:
            results = {"batching": batching(client, server.url, args),
                       "prefix_cache": client.submit(prefix_cache, server.url, args).result()}
    finally:
        server.stop()
        engine.shutdown(timeout=2)
    if args.result_json:
        Path(args.result_json).write_text(json.dumps({"args": vars(args), **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
