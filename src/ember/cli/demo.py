"""`ember make-demo-model`: write a random-weight model of a real architecture as a HF directory."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from ember.demo import ARCH_ALIASES, SHAPES
    p = sub.add_parser("make-demo-model", help="write a random-weight demo model (no download)")
    p.add_argument("out_dir")
    p.add_argument("--arch", "--shape", dest="shape", default="qwen3", choices=[*ARCH_ALIASES, *SHAPES],
                   help="qwen3/llama: tiny models with weights; larger shapes are config-only unless --weights")
    p.add_argument("--weights", action=argparse.BooleanOptionalAction, default=None,
                   help="write random weights (default: only for the small shapes; use --load-format dummy otherwise)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ember.demo import make_demo_model
    out = make_demo_model(args.out_dir, args.shape, args.weights, args.seed)
    print(f"wrote {args.shape} demo model to {out}")
    return 0
