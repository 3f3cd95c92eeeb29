"""Host time before the first kernel of a batch `generate`: 256 prompts of 128 tokens, one 32k-token prefill step.

`gpu_decode.py`'s timeline starts a step where its launch begins, so the runner's input building counts in the
step's device time there. This splits the host's side, in ms from the `generate` call, medians over --runs:
  intake    to the first Scheduler.schedule (prompt checks, Request / RequestOutput objects, queueing)
  schedule  to the end of that schedule (block allocation for every prompt)
  prepare   to the end of ModelRunner._prepare (positions, slots, block tables; pinned copies on CUDA)
  forward   to the model's forward call
  kernel    (CUDA) device time from the call to the first kernel (the embedding gather), from events

    python benchmarks/first_step_host.py [--shape qwen3-0.6b] [--runs 6] [--device cuda|cpu]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ember import LLM, SamplingParams
from ember.demo import dummy_model_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    llm = LLM(str(dummy_model_dir(args.shape)), load_format="dummy", dtype="bfloat16" if cuda else "float32",
              device=args.device, max_model_len=1024, max_num_seqs=256, max_num_batched_tokens=32768,
              enable_prefix_caching=False, progress=False)
    engine, runner = llm.engine, llm.engine.runner
    marks: dict[str, float] = {}

    def mark(obj, name: str, key: str, end: bool = True) -> None:
        orig = getattr(obj, name)

        def timed(*a, **k):
            marks.setdefault(key + "_start", time.perf_counter())
            result = orig(*a, **k)
            if end:
                marks.setdefault(key, time.perf_counter())
            return result
        setattr(obj, name, timed)

    mark(engine.scheduler, "schedule", "schedule")
    mark(runner, "_prepare", "prepare")
    mark(runner.model, "forward", "forward", end=False)
    embed = runner.model.model.embed_tokens
    first_kernel = []
    embed_forward = embed.forward

    def embed_timed(*a, **k):
        if cuda and not first_kernel:
            first_kernel.append(torch.cuda.Event(enable_timing=True))
            first_kernel[0].record()
        return embed_forward(*a, **k)
    embed.forward = embed_timed

    vocab = runner.vocab_size
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    llm.generate(torch.randint(10, vocab - 10, (8, 64), generator=g).tolist(), params)  # warm-up
    rows = []
    for run in range(args.runs):
        prompts = torch.randint(10, vocab - 10, (256, 128), generator=g).tolist()
        if cuda:
            torch.cuda.synchronize()
            start_ev = torch.cuda.Event(enable_timing=True)
        marks.clear()
        first_kernel.clear()
        t0 = time.perf_counter()
        if cuda:
            start_ev.record()
        llm.generate(prompts, params)
        row = dict(run=run, intake=marks["schedule_start"] - t0, schedule=marks["schedule"] - t0,
                   prepare=marks["prepare"] - t0, forward=marks["forward_start"] - t0)
        row = {k: v if k == "run" else round(v * 1e3, 2) for k, v in row.items()}
        if cuda:
            torch.cuda.synchronize()
            row["kernel"] = round(start_ev.elapsed_time(first_kernel[0]), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("median", json.dumps({k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "run"}))


if __name__ == "__main__":
    main()
