"""The projection before a residual add + RMSNorm at decode batch sizes (cuBLAS), with its split-K reduce as its
own kernel or summed inside the norm.

At batch 256 cuBLAS runs qwen3-8b's down projection (N=4096, K=12288) as a split-K GEMM and a reduce kernel
(4.5 us of a ~10 ms step, x 36 layers), then ember's add + RMSNorm kernel reads the reduced output again. Here the
split is ours: a batched GEMM over S slices of K writes S float32 partial products, and the norm kernel sums them
(`ops.triton.norm.add_rms_norm_parts`): one kernel and one launch gap fewer. The engine does this for a gated
MLP's down projection (`ops.triton.gemm.gated_linear_parts`, `SPLIT_K_PARTS`, `SPLIT_K_ROWS`) from this sweep.

    python benchmarks/splitk_norm.py [--batches 64,128,256] [--out benchmarks/results/NAME]

Each row replays a CUDA graph over distinct weight copies (>= 512 MB, from HBM, not L2), as benchmarks/gemv.py.
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

from ember.ops.triton.gemm import split_k_parts  # noqa: E402
from ember.ops.triton.norm import add_rms_norm, add_rms_norm_parts  # noqa: E402

SHAPES = {"8b down": (4096, 12288), "llama down": (4096, 14336), "8b o": (4096, 4096), "0.6b down": (1024, 3072)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--splits", default="1,2,3,4")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for name, (n, k) in SHAPES.items():
        ws = weight_copies(n, k, 512 * 2**20)
        nw = torch.randn(n, device=dev, dtype=dt)
        for m in (int(b) for b in args.batches.split(",")):
            x = torch.randn(m, k, device=dev, dtype=dt)
            res = torch.randn(m, n, device=dev, dtype=dt)
            base = graph_us([lambda w=w: add_rms_norm(F.linear(x, w), res, nw, 1e-6) for w in ws])
            row = dict(shape=name, batch=m, n=n, k=k, cublas_then_norm_us=base)
            ref = add_rms_norm(F.linear(x, ws[0]), res, nw, 1e-6)
            for s in (int(v) for v in args.splits.split(",")):
                if k % s:
                    continue
                out = add_rms_norm_parts(split_k_parts(x, ws[0], s), res, nw, 1e-6)
                err = max((a.float() - b.float()).abs().max().item() for a, b in zip(out, ref))
                row[f"split{s}_us"] = graph_us([lambda w=w: add_rms_norm_parts(split_k_parts(x, w, s), res, nw, 1e-6)
                                                for w in ws])
                row[f"split{s}_err"] = err
            rows.append(row)
            best = min((v, key) for key, v in row.items() if key.endswith("_us"))
            print(f"{name:<10} M={m:>4}: cuBLAS + norm {base:6.1f} us; "
                  + "; ".join(f"{key[:-3]} {v:6.1f}" for key, v in row.items()
                              if key.startswith("split") and key.endswith("_us"))
                  + f"  (best: {best[1][:-3]})", flush=True)
        del ws
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
