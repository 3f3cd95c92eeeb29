"""qwen3-8b's projections and LM head through torch's two BLAS backends on one GPU: cuBLAS (torch's default) and
cuBLASLt (`torch.backends.cuda.preferred_blas_library("cublaslt")`), which pick their kernels by different
heuristics. At the rows of a decode step (128-256) and of a prefill step (16,384), in TFLOP/s against the matmul
peak measured in the same run (8192^3). Each timing replays a CUDA graph over distinct weight copies (>= 768 MB,
from HBM) as benchmarks/gemv.py does.

    python benchmarks/blas_backends.py [--rows 128,256,16384] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from gemv import graph_us, weight_copies  # noqa: E402
from gpu_decode import matmul_tflops  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}  # qwen3-8b: N, K
BACKENDS = ("cublas", "cublaslt")


def projection_cases(shapes: str, rows: str):
    """(name, n, k, m, weight copies) for each projection named in `shapes` at each row count in `rows`; the LM head
    at the sampled rows (<= 256) only. A shape's weight copies are dropped once its rows are done."""
    for name in shapes.split(","):
        n, k = SHAPES[name]
        ws = weight_copies(n, k, 768 * 2**20)
        for m in tqdm([int(r) for r in rows.split(",")], desc=name, leave=False):
            if name == "lm_head" and m > 256:  # the LM head sees the sampled rows only
                continue
            yield name, n, k, m, ws
        del ws
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,256,16384")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    peak = matmul_tflops()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {peak:.0f} TFLOP/s (8192^3)")
    rows = []
    for name, n, k, m, ws in projection_cases(args.shapes, args.rows):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = dict(shape=name, m=m, n=n, k=k)
        outs = {}
        for backend in BACKENDS:
            torch.backends.cuda.preferred_blas_library(backend)
            calls = [(lambda w=w: F.linear(x, w)) for w in ws] * max(1, 8 // len(ws))
            row[backend + "_us"] = graph_us(calls, replays=10)
            outs[backend] = F.linear(x, ws[0]).float()
        torch.backends.cuda.preferred_blas_library("cublas")
        flops = 2 * m * n * k
        row.update({b + "_tflops": flops / row[b + "_us"] * 1e-6 for b in BACKENDS},
                   max_abs_diff=(outs["cublas"] - outs["cublaslt"]).abs().max().item())
        rows.append(row)
        tqdm.write(f"{name:8s} M={m:6d}: cublas {row['cublas_us']:9.1f} us ({row['cublas_tflops']:4.0f} TFLOP/s) "
                   f"cublaslt {row['cublaslt_us']:9.1f} us ({row['cublaslt_tflops']:4.0f})  "
                   f"max |diff| {row['max_abs_diff']:.2e}")
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), peak_tflops=peak,
                                                           torch=torch.__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
