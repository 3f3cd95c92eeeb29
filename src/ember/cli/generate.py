"""`ember generate`: stream a completion (or a chat reply with --chat) to stdout."""
from __future__ import annotations

import argparse
import sys

from ember.cli.common import add_model_args, build_llm


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt, streamed to stdout")
    add_model_args(p)
    p.add_argument("--prompt", "-p", default="Once upon a time", help="the prompt (or the user message with --chat)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    p.add_argument("--system", default=None, help="system message, with --chat")
    p.add_argument("--no-thinking", action="store_true", help="pass enable_thinking=False to the chat template")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=None, help="default: the model's generation config")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=run)


def _params(llm, args: argparse.Namespace):
    overrides = {k: v for k, v in dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k).items()
                 if v is not None}
    return llm.engine.default_sampling_params().replace(max_tokens=args.max_tokens, seed=args.seed, **overrides)


def run(args: argparse.Namespace) -> int:
    llm = build_llm(args, progress=sys.stderr.isatty())
    try:
        return _generate(llm, args)
    finally:
        llm.close()


def _generate(llm, args: argparse.Namespace) -> int:
    params = _params(llm, args)
    tok = llm.get_tokenizer()
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": args.prompt})
        ids = tok.encode_chat(messages, add_generation_prompt=True,
                              enable_thinking=False if args.no_thinking else None)
    else:
        ids = tok.encode(args.prompt)
        sys.stdout.write(args.prompt)
    engine = llm.engine
    engine.add_request("cli", ids, params)
    while engine.has_unfinished():
        for delta in engine.step():
            sys.stdout.write(delta.new_text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
