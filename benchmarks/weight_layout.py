"""cuBLAS at decode rows with the weights stored as checkpoints have them ([N, K], K contiguous: y = x W^T, the "TN"
GEMM torch's F.linear runs) against the transpose ([K, N], N contiguous: y = x W, "NN"). The two layouts reach
different cuBLAS kernel families; this asks whether the other one runs qwen3-8b's projections faster at the row
counts of a decode step (ember stores [N, K]; its batch-1 GEMV reads rows of it).

Each time is one call in a CUDA graph cycling over distinct weight copies (read from HBM, as in a step), median of
replays; the outputs are checked equal up to bf16 rounding.

    python benchmarks/weight_layout.py [--rows 128,256] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from gemv import graph_us, weight_copies  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}  # qwen3-8b: N, K


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for name, (n, k) in SHAPES.items():
        ws = weight_copies(n, k, 512 * 2**20, max_copies=8)
        wts = [w.t().contiguous() for w in ws]  # [K, N]
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref, alt = F.linear(x, ws[0]), x @ wts[0]
            err = ((alt.float() - ref.float()).norm() / ref.float().norm()).item()
            tn = graph_us([lambda w=w: F.linear(x, w) for w in ws])
            nn_ = graph_us([lambda w=w: x @ w for w in wts])
            row = dict(proj=name, m=m, n=n, k=k, tn_us=tn, nn_us=nn_, ratio=nn_ / tn, rel_err=err,
                       tn_tflops=2 * m * n * k / tn * 1e-6, nn_tflops=2 * m * n * k / nn_ * 1e-6)
            rows.append(row)
            print(f"{name:8s} M={m:4d}: [N,K] {tn:8.1f} us ({row['tn_tflops']:.0f} TFLOP/s)  [K,N] {nn_:8.1f} us "
                  f"({row['nn_tflops']:.0f})  ratio {row['ratio']:.3f}  err {err:.1e}", flush=True)
        del ws, wts
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows),
                                                       indent=1))


if __name__ == "__main__":
    main()
