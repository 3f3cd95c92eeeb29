"""Continuous admission, offline: N requests through max_num_seqs sequence slots, prompts of P tokens and output
lengths spread over [lo, hi] (seeded), so requests finish at different steps and the waiting ones are admitted
while the rest decode. Every admission is a mixed step: the new prompts and every running sequence's decode token,
what a loaded server runs whenever a request arrives. Per shape: output tok/s end to end (LLM.generate, random
weights in the real shape), the number of steps and of mixed steps among them.

    python benchmarks/admission.py [--shapes qwen3_5-default,qwen3-8b] [--requests 256] [--max-num-seqs 64]
        [--prompt-len 128] [--output-lens 64,256] [--out PREFIX]
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path

import torch

from ember import LLM, SamplingParams
from ember.demo import SHAPES, dummy_model_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3_5-default,qwen3-8b")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-lens", default="64,256", help="lo,hi: each request's output length, uniform")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=None, help="path prefix: writes PREFIX.json")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.output_lens.split(","))
    rng = random.Random(0)
    lens = [rng.randint(lo, hi) for _ in range(args.requests)]
    results = []
    for shape in args.shapes.split(","):
        llm = LLM(str(dummy_model_dir(shape)), load_format="dummy", dtype="bfloat16",
                  max_model_len=args.prompt_len + hi + 16, max_num_seqs=args.max_num_seqs,
                  enable_prefix_caching=False, progress=False)
        vocab = SHAPES[shape]["vocab_size"]
        prompts = [[rng.randrange(10, vocab - 10) for _ in range(args.prompt_len)] for _ in range(args.requests)]
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lens]
        runner = llm.engine.runner
        launch, steps = runner.launch, []

        def counted(out, *a, **kw):  # decode-only steps schedule one token per sequence
            steps.append(out.num_batched_tokens > len(out.seqs))
            return launch(out, *a, **kw)

        runner.launch = counted
        llm.generate(prompts[:8], params[:8])  # compiles the prefill kernels outside the timings
        for run in range(args.runs):
            steps.clear()
            t = time.perf_counter()
            outs = llm.generate(prompts, params)
            wall = time.perf_counter() - t
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            row = dict(shape=shape, run=run, requests=args.requests, max_num_seqs=args.max_num_seqs,
                       prompt_len=args.prompt_len, output_lens=[lo, hi], output_tokens=tokens, wall_s=wall,
                       output_tok_s=tokens / wall, steps=len(steps), mixed_steps=sum(steps))
            print(json.dumps(row), flush=True)
            results.append(row)
        llm.close()
        del llm, runner
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"{'shape':<16}{'run':>4}{'output tok/s':>13}{'wall s':>8}{'steps':>7}{'mixed':>7}")
    for r in results:
        print(f"{r['shape']:<16}{r['run']:>4}{r['output_tok_s']:>13.0f}{r['wall_s']:>8.2f}{r['steps']:>7}"
              f"{r['mixed_steps']:>7}")
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
