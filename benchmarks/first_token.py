"""Time to the first token of one prompt (batch 1): the eager prefill step, where the host launches every kernel.

Decode steps replay CUDA graphs; a prefill (mixed) step runs the model eagerly, so its time is the larger of the
device's work and the host's Python + launches. gpu_decode.py's batch-1 rows showed a 128-token prefill of
qwen3-0.6b taking ~14 ms of device-timeline time where its kernels need well under 1 ms. Per prompt length this
reports, medians over --runs:
  ttft      wall ms of generate(max_tokens=1) (intake, schedule, prepare, forward, sample, sync, output)
  launch    host ms of ModelRunner.launch (prepare + the forward's launches + the sampler's)
  device    device ms of the forward from events around launch (waiting on the host shows up here)
  kernels   device ms of the kernels alone (torch.profiler, sum of kernel time) and how many ran
and the kernel table at the first length; --host-profile adds a cProfile of the launches there.

    python benchmarks/first_token.py [--shapes qwen3-0.6b,qwen3-8b] [--lens 16,128,512,2048] [--host-profile]
        [--out PREFIX]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

from ember import LLM, SamplingParams
from ember.demo import dummy_model_dir


def prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def measure(llm, n: int, vocab: int, runs: int) -> dict:
    runner = llm.engine.runner
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    launch = runner.launch
    host, dev = [], []

    def timed_launch(out):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        handle = launch(out)
        host.append(1e3 * (time.perf_counter() - t))
        end.record()
        dev.append((start, end))
        return handle

    llm.generate([prompt(n, vocab, 0)], params)  # compiles at this length outside the timings
    runner.launch = timed_launch
    ttft = []
    try:
        for i in range(runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            llm.generate([prompt(n, vocab, i + 1)], params)
            ttft.append(1e3 * (time.perf_counter() - t))
    finally:
        runner.launch = launch
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate([prompt(n, vocab, 99)], params)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_ms = sum(e.self_device_time_total for e in events) / 1e3
    count = sum(e.count for e in events)
    return dict(prompt_len=n, ttft_ms=statistics.median(ttft), launch_ms=statistics.median(host),
                device_ms=statistics.median(s.elapsed_time(e) for s, e in dev), kernel_ms=kernel_ms,
                kernels=count, table=prof.key_averages().table(sort_by="cuda_time_total", row_limit=20,
                                                                max_name_column_width=60))


def host_profile(llm, n: int, vocab: int) -> str:
    """cProfile of ModelRunner.launch over 10 prompts of n tokens: own time, then cumulative."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    runner = llm.engine.runner
    launch, prof = runner.launch, cProfile.Profile()

    def profiled(out):
        prof.enable()
        try:
            return launch(out)
        finally:
            prof.disable()

    runner.launch = profiled
    try:
        for i in range(10):
            llm.generate([prompt(n, vocab, 200 + i)], params)
    finally:
        runner.launch = launch
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(50)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    ap.add_argument("--lens", default="16,128,512,2048")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--host-profile", action="store_true", help="cProfile of the launches at the first length")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lens = [int(x) for x in args.lens.split(",")]
    results = []
    for shape in args.shapes.split(","):
        llm = LLM(str(dummy_model_dir(shape)), load_format="dummy", dtype="bfloat16", max_model_len=max(lens) + 64,
                  max_num_seqs=64, enable_prefix_caching=False, progress=False)
        vocab = llm.engine.runner.vocab_size
        for n in lens:
            r = dict(shape=shape, **measure(llm, n, vocab, args.runs))
            table = r.pop("table")
            print(json.dumps(r), flush=True)
            results.append(r)
            if n == lens[0]:
                print(f"{shape} prompt {n}\n{table}", flush=True)
        if args.host_profile:
            print(f"{shape} ModelRunner.launch, prompt {lens[0]}, 10 runs\n{host_profile(llm, lens[0], vocab)}",
                  flush=True)
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    print(f"{'shape':<12}{'prompt':>7}{'ttft ms':>9}{'launch ms':>10}{'device ms':>10}{'kernel ms':>10}{'kernels':>8}")
    for r in results:
        print(f"{r['shape']:<12}{r['prompt_len']:>7}{r['ttft_ms']:>9.2f}{r['launch_ms']:>10.2f}{r['device_ms']:>10.2f}"
              f"{r['kernel_ms']:>10.2f}{r['kernels']:>8}")
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
