"""Batch-1 decode projections on one GPU: ember's Triton GEMV (ember.ops.triton.gemm) against cuBLAS, per shape,
with the op before each projection fused (ours) or as its own kernel (cuBLAS + ember's Triton norm/activation).

Each measurement replays a CUDA graph of R launches over R distinct weight copies (>= 512 MB in all), so weights
come from HBM, not L2, and launch gaps are those of a captured decode step. Ours is timed with programmatic
dependent launch (the default on Hopper: each GEMV loads its first weight tile while the one before finishes) and
without. Shapes are the projections of the qwen3-0.6b / qwen3-8b / llama-3-8b decoders: qkv and gate_up fed by
the RMSNorm (+ residual add), o, and down fed by the gated activation; and gemma4-default's ("g4 ..."), whose
K = 2304 is no power of two.

    python benchmarks/gemv.py [--sweep] [--out benchmarks/results/NAME]

--sweep times a grid of tile configurations per shape and prints the best next to the default (gemv_config).
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

from ember.ops.activation import gated
from ember.ops.triton import gemm, pdl
from ember.ops.triton.activation import silu_and_mul
from ember.ops.triton.norm import add_rms_norm

SHAPES = {  # name: (N, K, prologue)
    "0.6b qkv": (4096, 1024, "norm"), "0.6b o": (1024, 2048, None), "0.6b gate_up": (6144, 1024, "norm"),
    "0.6b down": (1024, 3072, "silu"),
    "8b qkv": (6144, 4096, "norm"), "8b o": (4096, 4096, None), "8b gate_up": (24576, 4096, "norm"),
    "8b down": (4096, 12288, "silu"), "llama down": (4096, 14336, "silu"),
    # gemma4-default (hidden 2304, sliding layers' heads 256 wide, global 512): its qkv input is already normed
    # (the previous layer's fused norms), down is fed by gelu(gate) * up, the per-layer input gate and projection
    "g4 qkv": (4096, 2304, None), "g4 qkv global": (8192, 2304, None), "g4 o": (2304, 2048, None),
    "g4 gate_up": (18432, 2304, None), "g4 down": (2304, 9216, "gelu"), "g4 ple gate": (256, 2304, None),
    "g4 ple proj": (2304, 256, None),
}
ACTS = {"silu": "silu", "gelu": "gelu_pytorch_tanh"}


def weight_copies(n: int, k: int, min_bytes: int, min_copies: int = 2, max_copies: int | None = None) -> list:
    """Distinct bf16 [n, k] weights (scaled by k**-0.5) spanning at least min_bytes: a graph cycling over them reads
    each from HBM, not L2."""
    copies = max(min_copies, -(-min_bytes // (n * k * 2)))
    copies = min(copies, max_copies) if max_copies else copies
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]


def graph_us(calls, replays: int = 20) -> float:
    """Median device microseconds per call of one replay of a graph launching `calls` in order."""
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
    return statistics.median(times) / len(calls) * 1e3


def fastest(default: tuple[float, dict], configs, time_us) -> tuple[float, dict]:
    """(us, config): the fastest of `default` (its time and config) and each config timed by time_us(config).
    Configs the compiler rejects (registers, shared memory) are reported and skipped."""
    best = default
    for cfg in configs:
        try:
            t = time_us(cfg)
        except Exception as e:
            tqdm.write(f"  skip {cfg}: {type(e).__name__}")
            continue
        best = min(best, (t, cfg), key=lambda b: b[0])
    return best


def sweep_configs(small: bool = False):
    grid = ((1, 2, 4, 8), (256, 512, 1024), (4, 8), (1, 3)) if small else \
        ((1, 2, 4, 8, 16), (256, 512, 1024, 2048), (4, 8), (1, 2, 3, 4))
    for bn, bk, w, s in itertools.product(*grid):
        if bn * bk <= 16384:
            yield dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--small-grid", action="store_true", help="sweep 48 tiles instead of 152")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in tqdm(args.shapes.split(","), desc="shapes"):
        n, k, prologue = SHAPES[name]
        nbytes = n * k * 2
        weights = weight_copies(n, k, 512 * 2**20, min_copies=4, max_copies=64)
        act = ACTS.get(prologue)
        x = torch.randn(1, 2 * k if act else k, device="cuda", dtype=torch.bfloat16)
        res, nw = torch.randn(1, k, device="cuda", dtype=torch.bfloat16), torch.ones(k, device="cuda", dtype=torch.bfloat16)
        norm = (res, nw, 1e-6, False) if prologue == "norm" else None

        def cublas(w):
            if prologue == "norm":
                return lambda: F.linear(add_rms_norm(x, res, nw, 1e-6)[0], w)
            return lambda: F.linear((silu_and_mul(x) if act == "silu" else gated(x, act)) if act else x, w)

        def ours(w, cfg=None):
            return lambda: gemm.launch_gemv(x, w, None, act, norm, cfg)

        ref, got = cublas(weights[0])(), ours(weights[0])()[0]
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        row = dict(shape=name, n=n, k=k, prologue=prologue, rel_err=err, cublas_us=graph_us([cublas(w) for w in weights]),
                   ours_us=graph_us([ours(w) for w in weights]), default=gemm.gemv_config(n, k, act is not None))
        pdl.set_enabled(False)  # the same chain launched without programmatic dependent launch
        row["ours_no_pdl_us"] = graph_us([ours(w) for w in weights])
        pdl.set_enabled(None)
        if args.sweep:
            best = fastest((row["ours_us"], row["default"]), sweep_configs(args.small_grid),
                           lambda cfg: graph_us([ours(w, cfg) for w in weights[:8]], replays=10))
            row.update(best_us=best[0], best=best[1])
        rows.append(row)
        tqdm.write(f"{name:13s} {n:6d}x{k:<6d} {prologue or '':5s}: cuBLAS(+op) {row['cublas_us']:6.1f} us  "
                   f"ours {row['ours_us']:6.1f} us ({nbytes / row['ours_us'] / 1e6:.2f} TB/s; "
                   f"{row['ours_no_pdl_us']:6.1f} us without PDL) err {err:.1e}"
                   + (f"  best {row['best_us']:6.1f} us {row['best']}" if args.sweep else ""))
        del weights
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
