"""Decode-sized GEMMs on one GPU: ember's skinny Triton kernel (ember.ops.triton.gemm) against cuBLAS, as the
fraction of the measured copy bandwidth each reaches reading the weights.

Each measurement replays a CUDA graph of R launches over R distinct weight copies (>= 512 MB in all), so the
weights come from HBM, not L2, and launch gaps are those of a captured decode step. Shapes are the projections
of the qwen3-0.6b / qwen3-8b / llama-3-8b decoders (qkv, o, gate_up, down with the fused activation).

    python benchmarks/skinny_gemm.py [--sweep] [--out benchmarks/results/NAME]

--sweep times a grid of tile configurations per shape and batch size and prints the best next to the default
heuristic (skinny_config): how the heuristic is chosen.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ember.ops.activation import silu_and_mul
from ember.ops.triton import gemm

SHAPES = {  # name: (N, K, fused activation)
    "0.6b qkv": (4096, 1024, None), "0.6b o": (1024, 2048, None), "0.6b gate_up": (6144, 1024, None),
    "0.6b down": (1024, 3072, "silu"),
    "8b qkv": (6144, 4096, None), "8b o": (4096, 4096, None), "8b gate_up": (24576, 4096, None),
    "8b down": (4096, 12288, "silu"),
    "llama down": (4096, 14336, "silu"), "llama gate_up": (28672, 4096, None),
}
BATCHES = (1, 2, 4, 8, 16)


def copy_bandwidth() -> float:
    src = torch.empty(2**30, device="cuda", dtype=torch.int16)
    dst = torch.empty_like(src)
    ms = graph_ms([lambda: dst.copy_(src)])
    return 2 * src.numel() * 2 / ms * 1e3


def graph_ms(calls, replays: int = 20) -> float:
    """Median device ms of one replay of a graph launching `calls` in order, per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:  # warm-up: compile, pick algorithms
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) / len(calls)


def sweep_configs(m: int):
    if m == 1:
        for bn, bk, w, s in itertools.product((1, 2, 4, 8), (256, 512, 1024, 2048), (4, 8), (1, 2, 4)):
            if bn * bk <= 16384:
                yield dict(BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, USE_DOT=False, num_warps=w, num_stages=s)
    else:
        for bn, bk, w, s in itertools.product((16, 32, 64), (64, 128, 256), (4,), (2, 3, 4)):
            if bn * bk <= 16384:
                yield dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, USE_DOT=True, num_warps=w, num_stages=s)
        for bn, bk, w in itertools.product((1, 2, 4, 8), (128, 256, 512), (4,)):
            if triton_pow2(m) * bn * bk <= 8192:
                yield dict(BLOCK_M=triton_pow2(m), BLOCK_N=bn, BLOCK_K=bk, USE_DOT=False, num_warps=w, num_stages=2)


def triton_pow2(m: int) -> int:
    return 1 << (m - 1).bit_length()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    names = args.shapes.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    for name in tqdm(names, desc="shapes"):
        n, k, act = SHAPES[name]
        nbytes = n * k * 2
        copies = max(4, min(64, -(-512 * 2**20 // nbytes)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
        for m in batches:
            x = torch.randn(m, 2 * k if act else k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(silu_and_mul(x) if act else x, weights[0])

            def cublas(w):
                return lambda: F.linear(silu_and_mul(x) if act else x, w)

            def ours(w, cfg=None):
                return lambda: gemm.launch_skinny(x, w, None, act, cfg)

            err = ((ours(weights[0])().float() - ref.float()).norm() / ref.float().norm()).item()
            t_cublas = graph_ms([cublas(w) for w in weights])
            t_ours = graph_ms([ours(w) for w in weights])
            row = dict(shape=name, m=m, n=n, k=k, act=act, rel_err=err, cublas_us=t_cublas * 1e3,
                       ours_us=t_ours * 1e3, cublas_bw=nbytes / t_cublas / 1e9 / bw * 1e12,
                       ours_bw=nbytes / t_ours / 1e9 / bw * 1e12, default=gemm.skinny_config(m, n, k))
            if args.sweep:
                best = (t_ours, row["default"])
                for cfg in sweep_configs(m):
                    try:
                        t = graph_ms([ours(w, cfg) for w in weights[:8]], replays=10)
                    except Exception as e:  # a config the compiler rejects (registers, shared memory)
                        tqdm.write(f"  skip {cfg}: {type(e).__name__}")
                        continue
                    if t < best[0]:
                        best = (t, cfg)
                row.update(best_us=best[0] * 1e3, best_bw=nbytes / best[0] / 1e9 / bw * 1e12, best=best[1])
            rows.append(row)
            tqdm.write(f"{name:14s} M={m:2d}: cuBLAS {row['cublas_us']:7.1f} us ({row['cublas_bw']:5.1%})  "
                       f"ours {row['ours_us']:7.1f} us ({row['ours_bw']:5.1%}) err {err:.1e}"
                       + (f"  best {row['best_us']:7.1f} us ({row['best_bw']:5.1%}) {row['best']}" if args.sweep else ""))
        del weights
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(copy_bw=bw, rows=rows), indent=1))


if __name__ == "__main__":
    main()
