"""One mixed step at the runner: k running sequences' decode tokens (context 256) and one new prompt of L tokens,
what a server's running requests wait on while a request is admitted. Per shape and (k, L), the wall time of
ModelRunner.launch + result() (the step's sampled ids on the host), medians over --runs:
  graphed  through the mixed-step CUDA graph of its padded token count, where the step fits one ("-" where not)
  eager    the same step through ModelRunner._launch_eager
Every token writes its KV into the scratch block and its recurrent state into the scratch slot (the start-up
warm-up's sequences, ModelRunner.scratch_seq), so the steps repeat. EMBER_STATE_MIXED_SEQS sets how many sequence
slots a hybrid model's mixed graphs have (256).

    python benchmarks/mixed_step.py [--shapes qwen3-8b,qwen3_5-default] [--decodes 0,15,31,63] [--lens 128,512]
        [--max-num-seqs 64] [--out PREFIX]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ember import LLM
from ember.demo import dummy_model_dir
from ember.engine.scheduler import SchedulerOutput


def timed(launch, out: SchedulerOutput, runs: int) -> float:
    launch(out).result()  # compiles and warms outside the timings
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        launch(out).result()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3-8b,qwen3_5-default")
    ap.add_argument("--decodes", default="0,15,31,63")
    ap.add_argument("--lens", default="128,512")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    decodes = [int(x) for x in args.decodes.split(",")]
    lens = [int(x) for x in args.lens.split(",")]
    results = []
    for shape in args.shapes.split(","):
        llm = LLM(str(dummy_model_dir(shape)), load_format="dummy", dtype="bfloat16", max_model_len=1024,
                  max_num_seqs=args.max_num_seqs, enable_prefix_caching=False, progress=False)
        runner = llm.engine.runner
        cases = [(k, n) for k in decodes for n in lens]
        for k, n in tqdm(cases, desc=shape):
            seqs = [runner.scratch_seq(i, 1, 255) for i in range(k)] + [runner.scratch_seq(k, n, 0)]
            out = SchedulerOutput(seqs, k + n, [])
            padded = runner.graphs.mixed_size(seqs, k + n) if runner.graphs is not None else None
            row = dict(shape=shape, decodes=k, prompt_len=n, tokens=k + n, padded=padded,
                       graphed_ms=timed(runner.launch, out, args.runs) if padded else None,
                       eager_ms=timed(runner._launch_eager, out, args.runs))
            results.append(row)
        llm.close()
        del llm, runner
        gc.collect()
        torch.cuda.empty_cache()
    print(f"{'shape':<16}{'decodes':>8}{'prompt':>7}{'padded':>7}{'graphed ms':>11}{'eager ms':>9}")
    for r in results:
        graphed = f"{r['graphed_ms']:.2f}" if r["graphed_ms"] is not None else "-"
        print(f"{r['shape']:<16}{r['decodes']:>8}{r['prompt_len']:>7}{r['padded'] or '-':>7}{graphed:>11}"
              f"{r['eager_ms']:>9.2f}")
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
