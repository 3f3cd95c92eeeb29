"""`ember bench`: an async streaming load generator against any OpenAI-compatible server (ember, vLLM, llama.cpp).

Measures, per request, TTFT (time to first token), ITL (gaps between streamed chunks), TPOT (mean time per output
token after the first) and E2E latency, and per run the p50/p90/p99 of each plus output tokens/s. Requests go out
at a fixed concurrency (closed loop) or as a Poisson process at --request-rate (open loop, optionally capped by
--concurrency). The random dataset asks for `ignore_eos` (a vLLM extension) so output lengths stay fixed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# common words that most tokenizers keep whole, so N words is close to N tokens
_WORDS = ("the of and to in is was for on that with as by at from his her they have had not but are this which "
          "one all were when there been has more will would who out into time only some could new other than "
          "then now over also after first two may back years where way well down should because each just "
          "those people how too little state good very make world still own see men work long get here between "
          "both life being under never day same another know while last might us great old year off come since "
          "against go came right used take three house river bridge town water bread salt light morning").split()


@dataclass(slots=True)
class BenchRequest:
    prompt: str | list[dict]  # text for completions, messages for chat
    output_len: int


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass(slots=True)
class BenchConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "completions"  # or "chat"
    concurrency: int | None = 16
    request_rate: float | None = None  # requests/s, Poisson arrivals; None: all at once
    api_key: str | None = None
    timeout: float = 600.0
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be 'chat' or 'completions', got {self.endpoint!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError(f"request_rate must be > 0 requests/s, got {self.request_rate}")


@dataclass(slots=True)
class BenchSummary:
    concurrency: int | None
    request_rate: float | None
    num_requests: int
    num_ok: int
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    output_tok_s: float
    request_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    errors: list[str] = field(default_factory=list)


# ---- datasets -------------------------------------------------------------------------------------------


def random_requests(num: int, input_len: int, output_len: int, seed: int = 0, chat: bool = False) -> list[BenchRequest]:
    """Prompts of `input_len` random common words (close to that many tokens), each wanting `output_len` tokens."""
    if num < 1 or input_len < 1 or output_len < 1:
        raise ValueError(f"num-requests, input-len and output-len must be >= 1, got {num}, {input_len}, {output_len}")
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(_WORDS, k=input_len)) for _ in range(num)]
    return [BenchRequest([{"role": "user", "content": t}] if chat else t, output_len) for t in texts]


def load_dataset(path: str | Path, num: int, output_len: int, chat: bool = False) -> list[BenchRequest]:
    """JSONL lines with "prompt" (text) or "messages" (chat), optionally "output_len"/"max_tokens"; cycled to `num`."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i + 1} is not valid JSON: {e}") from None
        if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
            raise ValueError(f"{path}:{i + 1} needs a 'prompt' string or a 'messages' list")
        prompt = row.get("messages") or row["prompt"]
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        elif not chat and not isinstance(prompt, str):
            prompt = "\n".join(str(m.get("content", "")) for m in prompt)
        rows.append(BenchRequest(prompt, int(row.get("output_len") or row.get("max_tokens") or output_len)))
    if not rows:
        raise ValueError(f"{path} has no requests")
    return [rows[i % len(rows)] for i in range(num)]


# ---- one request ----------------------------------------------------------------------------------------


def request_body(cfg: BenchConfig, request: BenchRequest) -> dict:
    body = {"model": cfg.model, "max_tokens": request.output_len, "stream": True, "temperature": cfg.temperature,
            "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    key = "messages" if cfg.endpoint == "chat" else "prompt"
    return {**body, key: request.prompt}


def _chunk_text(chunk: dict) -> str:
    texts = []
    for choice in chunk.get("choices") or []:
        texts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(texts)


async def send_request(client, cfg: BenchConfig, request: BenchRequest) -> RequestResult:
    """Streams one request and times it; any failure is recorded, never raised."""
    path = "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"
    result, start = RequestResult(ok=False), time.perf_counter()
    last, num_chunks = start, 0
    try:
        async with client.stream("POST", path, json=request_body(cfg, request)) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message", chunk["error"]))[:200]
                    return result
                now = time.perf_counter()
                if _chunk_text(chunk):
                    if num_chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last, num_chunks = now, num_chunks + 1
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"].get("completion_tokens", 0)
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
    except Exception as e:  # noqa: BLE001 - a failed request is a data point
        result.error = f"{type(e).__name__}: {e}"[:200]
        return result
    result.e2e = time.perf_counter() - start
    result.output_tokens = result.output_tokens or num_chunks  # servers without usage: one token per chunk
    result.ok = num_chunks > 0
    result.error = "" if result.ok else "the stream carried no text"
    return result


# ---- a run ----------------------------------------------------------------------------------------------


async def _run(cfg: BenchConfig, requests: list[BenchRequest], progress: bool) -> tuple[list[RequestResult], float]:
    import httpx
    from tqdm.auto import tqdm

    limit = asyncio.Semaphore(cfg.concurrency or len(requests))
    rng = random.Random(cfg.seed)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency or len(requests), max_keepalive_connections=None)
    label = f"c={cfg.concurrency}" if cfg.request_rate is None else f"rate={cfg.request_rate}/s"
    bar = tqdm(total=len(requests), desc=f"bench {label}", disable=not progress, file=sys.stderr)

    async with httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), headers=headers, timeout=cfg.timeout,
                                 limits=limits) as client:
        async def one(request: BenchRequest, delay: float) -> RequestResult:
            await asyncio.sleep(delay)
            async with limit:
                result = await send_request(client, cfg, request)
            bar.update(1)
            return result

        delays, t = [], 0.0
        for _ in requests:
            delays.append(t)
            t += rng.expovariate(cfg.request_rate) if cfg.request_rate else 0.0
        start = time.perf_counter()
        results = await asyncio.gather(*(one(r, d) for r, d in zip(requests, delays)))
        duration = time.perf_counter() - start
    bar.close()
    return list(results), duration


def _stats(values: list[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    ms = np.asarray(values) * 1000.0
    return {"mean": float(ms.mean()), "p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99))}


def summarize(cfg: BenchConfig, results: list[RequestResult], duration: float) -> BenchSummary:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    return BenchSummary(
        cfg.concurrency, cfg.request_rate, len(results), len(ok), duration, out_tokens,
        sum(r.prompt_tokens for r in ok), out_tokens / duration if duration else 0.0,
        len(ok) / duration if duration else 0.0, _stats([r.ttft for r in ok]),
        _stats([r.tpot for r in ok if r.tpot is not None]), _stats([x for r in ok for x in r.itl]),
        _stats([r.e2e for r in ok]), sorted({r.error for r in results if not r.ok})[:10])


def run_benchmark(cfg: BenchConfig, requests: list[BenchRequest], progress: bool = False) -> BenchSummary:
    """Runs `requests` against the server; resolves the model name from /v1/models when cfg.model is None."""
    if cfg.model is None:
        cfg.model = fetch_model_name(cfg)
    results, duration = asyncio.run(_run(cfg, requests, progress))
    return summarize(cfg, results, duration)


def fetch_model_name(cfg: BenchConfig) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    url = cfg.base_url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(url, headers=headers, timeout=30)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ValueError(f"cannot list models at {url} ({e}); is the server up? Or pass --model") from None
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{cfg.base_url}/v1/models lists no model; pass --model")
    return models[0]["id"]


# ---- reporting ------------------------------------------------------------------------------------------


def format_summary(s: BenchSummary) -> str:
    load = f"concurrency {s.concurrency}" if s.request_rate is None else f"rate {s.request_rate}/s"
    lines = [f"== {load}: {s.num_ok}/{s.num_requests} ok in {s.duration_s:.2f}s | "
             f"{s.output_tok_s:.1f} output tok/s | {s.request_s:.2f} req/s",
             f"   {'ms':<6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for name, stats in (("TTFT", s.ttft_ms), ("TPOT", s.tpot_ms), ("ITL", s.itl_ms), ("E2E", s.e2e_ms)):
        lines.append(f"   {name:<6}" + "".join(f"{stats[k]:>10.1f}" for k in ("mean", "p50", "p90", "p99")))
    lines += [f"   error: {e}" for e in s.errors]
    return "\n".join(lines)


def plot_sweep(summaries: list[BenchSummary], path: str | Path) -> None:
    """Latency percentiles and throughput against concurrency, one panel per metric."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s.concurrency or 0 for s in summaries]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (title, key) in zip(axes.flat, (("TTFT (ms)", "ttft_ms"), ("TPOT (ms)", "tpot_ms"),
                                            ("E2E latency (ms)", "e2e_ms"))):
        for pct in ("p50", "p90", "p99"):
            ax.plot(xs, [getattr(s, key)[pct] for s in summaries], marker="o", label=pct)
        ax.set(title=title, xlabel="concurrency", xscale="log", xticks=xs, xticklabels=[str(x) for x in xs])
        ax.legend()
    ax = axes.flat[3]
    ax.plot(xs, [s.output_tok_s for s in summaries], marker="o", color="k")
    ax.set(title="output tokens/s", xlabel="concurrency", xscale="log", xticks=xs, xticklabels=[str(x) for x in xs])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- command line ---------------------------------------------------------------------------------------


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="load-test an OpenAI-compatible server (TTFT, TPOT, ITL, E2E, tok/s)")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080")
    p.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-requests", type=int, default=64)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=None, help="requests in flight (default 16)")
    load.add_argument("--concurrency-sweep", default=None, help="comma-separated concurrencies, e.g. 1,4,16")
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson arrivals at this many requests/s (open loop; --concurrency caps in-flight)")
    p.add_argument("--input-len", type=int, default=128, help="random prompts of this many words (~tokens)")
    p.add_argument("--output-len", type=int, default=128, help="tokens asked of every request")
    p.add_argument("--dataset", default=None, help="JSONL with 'prompt' or 'messages' (+ optional 'output_len')")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (lengths then vary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="requests sent (and not measured) before the first run")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--result-json", default=None, help="write the config and every run's summary here")
    p.add_argument("--plot", default=None, help="PNG of latency and throughput against concurrency")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _concurrencies(args: argparse.Namespace) -> list[int | None]:
    if args.concurrency_sweep:
        try:
            values = [int(x) for x in args.concurrency_sweep.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--concurrency-sweep takes comma-separated ints, got {args.concurrency_sweep!r}") from None
        if not values or min(values) < 1:
            raise ValueError(f"--concurrency-sweep values must be >= 1, got {args.concurrency_sweep!r}")
        return values
    if args.concurrency is not None:
        return [args.concurrency]
    return [None] if args.request_rate is not None else [16]


def run(args: argparse.Namespace) -> int:
    chat = args.endpoint == "chat"
    requests = (load_dataset(args.dataset, args.num_requests, args.output_len, chat) if args.dataset
                else random_requests(args.num_requests, args.input_len, args.output_len, args.seed, chat))
    summaries = []
    if args.warmup > 0:
        cfg = BenchConfig(args.base_url, args.model, args.endpoint, args.warmup, None, args.api_key, args.timeout)
        run_benchmark(cfg, requests[:args.warmup])
        args.model = cfg.model
    for concurrency in _concurrencies(args):
        cfg = BenchConfig(args.base_url, args.model, args.endpoint, concurrency, args.request_rate, args.api_key,
                          args.timeout, not args.no_ignore_eos, seed=args.seed)
        summaries.append(run_benchmark(cfg, requests, progress=not args.no_progress))
        args.model = cfg.model
        print(format_summary(summaries[-1]), flush=True)
    if args.result_json:
        config = {k: v for k, v in vars(args).items() if k != "func"}
        Path(args.result_json).write_text(json.dumps({"config": config, "runs": [asdict(s) for s in summaries]},
                                                     indent=2))
    if args.plot:
        plot_sweep(summaries, args.plot)
    return 0 if all(s.num_ok == s.num_requests for s in summaries) else 1


def _main() -> int:
    parser = argparse.ArgumentParser(prog="ember")
    add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["bench", *sys.argv[1:]])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(_main())
