"""`ember serve [MODEL]`: the OpenAI- and Anthropic-compatible HTTP server (needs ember[server]).

SIGTERM / SIGINT stop accepting connections, let in-flight requests finish for --shutdown-timeout seconds,
abort the rest (their streams end with finish_reason "abort") and exit 0. A second SIGINT exits at once.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ember.cli.common import add_model_args, build_llm
from ember.config import default_max_num_batched_tokens, resolve_device

DEMO_SERVED_NAME = "ember-demo"


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI- and Anthropic-compatible HTTP API")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` (or x-api-key) on every /v1 route")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model directory's name)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most requests in one batch (default: 256 on a GPU, 64 on CPU; lowered where the per-request "
                        "caches of hybrid or sliding-window models would take over a quarter of the cache memory)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one engine step (default: 8192 on a GPU of 70 GiB or more, 2048 otherwise)")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable KV prefix caching")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="finish each engine step before scheduling the next (no host/device overlap)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM before they are aborted")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def served_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return Path(args.model).expanduser().resolve().name if args.model else DEMO_SERVED_NAME


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ember.engine.async_engine import AsyncEngine
    from ember.engine.core import freeze_gc_heap
    from ember.server import build_app
    from ember.server.background import GracefulServer

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} must be in [0, 65535]")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout {args.shutdown_timeout} must be >= 0")
    name = served_name(args)
    if args.model is None:
        from ember.demo import demo_model_dir
        print("ember serve: no MODEL given, serving the built-in demo model; it has random weights, "
              "so every reply is meaningless demo text", file=sys.stderr)
        args.model = str(demo_model_dir())
    if args.max_num_batched_tokens is None:  # a server's budget: lower than LLM.generate's on the same device
        args.max_num_batched_tokens = default_max_num_batched_tokens(resolve_device(args.device), online=True)
    llm = build_llm(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                    enable_prefix_caching=not args.no_prefix_caching,
                    async_scheduling=not args.no_async_scheduling, progress=sys.stderr.isatty())
    engine = AsyncEngine(llm.engine).start()
    app = build_app(engine, name, args.api_key)
    # uvicorn's own grace period is a backstop: the engine drain below normally ends every stream first
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=int(args.shutdown_timeout) + 5)
    server = GracefulServer(config, engine, args.shutdown_timeout)
    freeze_gc_heap()  # start-up is done: later GC passes skip the model and server objects
    print(f"ember: serving `{name}` (context {llm.engine.max_model_len} tokens) on http://{args.host}:{args.port}"
          f" - OpenAI /v1/chat/completions, /v1/completions; Anthropic /v1/messages; /metrics, /health",
          file=sys.stderr)
    server.run()
    engine.shutdown(timeout=0)
    return 0 if engine.error is None else 1


def _main() -> int:
    parser = argparse.ArgumentParser(prog="ember")
    add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["serve", *sys.argv[1:]])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(_main())
