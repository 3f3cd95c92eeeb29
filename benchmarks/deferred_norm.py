"""What deferring a pre-norm block's RMSNorm past its projection could save (FlashNorm, arXiv:2407.09577).

A Llama block's norm is y = g * x * r(x), r(x) = rsqrt(mean(x^2) + eps), a per-row scalar. So
norm(x) @ W^T = r(x) * (x @ (W diag g)^T): with g folded into the weights at load time, the projection reads the
raw residual stream and the kernel after it (the rotary/KV write after qkv, the SiLU after gate/up) scales its row by
r(x), which it computes from the stream itself. The residual add then needs no kernel of its own either: the
projection before it accumulates into the stream in place (cuBLAS's beta = 1, `h.addmm_`). Two kernels per layer
go: the add + RMSNorm before attention and the one before the MLP.

This times one qwen3-8b layer's differing ops in a CUDA graph over 36 layers of distinct weights, as the engine
runs them today against the deferred form, at decode and prefill rows. The kernels after qkv and gate/up are timed as
they are today in both (the deferred ones would also read the row of the stream for r: 8 KB a row).

So it is an upper bound, and a loose one. On an H100 it gave 189 -> 178 us per layer at 256 rows; the whole design,
built and run end to end (NOTES v29), lost 2-3% at qwen3-8b 256 x 128 -> 256: the activation kernel that reads
its rows' stream for r took 16 instead of 6 us (each program re-reads four 8 KB rows from L2 for every column
tile), prepare_qkv 4.8 instead of 3.6, and cuBLAS's beta = 1 kernels for o and down 7 us more than o plus the
split-K down projection. The engine keeps its fused add + RMSNorm kernels.

    python benchmarks/deferred_norm.py [--rows 8,32,64,128,256,512,8192] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from gemv import graph_us  # noqa: E402

from ember.ops.triton.activation import silu_and_mul  # noqa: E402
from ember.ops.triton.gemm import split_k_parts  # noqa: E402
from ember.ops.triton.norm import add_rms_norm, add_rms_norm_parts, rms_norm  # noqa: E402

HIDDEN, QKV, INTER = 4096, 6144, 12288


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="8,32,64,128,256,512,8192")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    copies = 8  # 8 x 0.39 GB of weights: each layer's come from HBM
    ws = [dict(qkv=torch.randn(QKV, HIDDEN, device=dev, dtype=dt) * 0.02,
               o=torch.randn(HIDDEN, HIDDEN, device=dev, dtype=dt) * 0.02,
               gu=torch.randn(2 * INTER, HIDDEN, device=dev, dtype=dt) * 0.02,
               down=torch.randn(HIDDEN, INTER, device=dev, dtype=dt) * 0.01) for _ in range(copies)]
    nw = torch.ones(HIDDEN, device=dev, dtype=dt)
    rows_out = []
    for m in (int(v) for v in args.rows.split(",")):
        layers = 36 if m <= 1024 else 4
        h = torch.randn(m, HIDDEN, device=dev, dtype=dt)
        attn = torch.randn(m, HIDDEN, device=dev, dtype=dt)
        parts = torch.randn(2, m, HIDDEN, device=dev, dtype=torch.float32)
        down_out = torch.randn(m, HIDDEN, device=dev, dtype=dt)  # above 512 rows the engine does not split K
        act_in = torch.randn(m, INTER, device=dev, dtype=dt)

        def stream_norm():  # the add + RMSNorm before attention, after the previous layer's down projection
            return add_rms_norm_parts(parts, h, nw, 1e-6) if m <= 512 else add_rms_norm(down_out, h, nw, 1e-6)

        def down(act, w):
            return split_k_parts(act, w, 2) if m <= 512 else F.linear(act, w)

        def today(i):
            w = ws[i % copies]

            def call():
                x, res = stream_norm()
                F.linear(x, w["qkv"])
                x2, _ = add_rms_norm(F.linear(attn, w["o"]), res, nw, 1e-6)
                act = silu_and_mul(F.linear(x2, w["gu"]))
                down(act, w["down"])
            return call

        def deferred(i, down_in_place=True):
            w = ws[i % copies]

            def call():
                if not down_in_place:  # the down projection's split-K partials summed into the stream by a kernel
                    stream_norm()
                F.linear(h, w["qkv"])
                h.addmm_(attn, w["o"].t())
                act = silu_and_mul(F.linear(h, w["gu"]))
                if down_in_place:
                    h.addmm_(act, w["down"].t())
                else:
                    down(act, w["down"])
            return call

        def in_place(i):  # the engine's EMBER_ADD_IN_PLACE_MIN_ROWS form: o and down add into the stream, the
            w = ws[i % copies]  # norms read it alone

            def call():
                F.linear(rms_norm(h, nw, 1e-6), w["qkv"])
                h.addmm_(attn, w["o"].t())
                act = silu_and_mul(F.linear(rms_norm(h, nw, 1e-6), w["gu"]))
                h.addmm_(act, w["down"].t())
            return call

        def gemms(i):
            w = ws[i % copies]
            return lambda: [F.linear(h, w["qkv"]), F.linear(attn, w["o"]), F.linear(h, w["gu"]),
                            F.linear(act_in, w["down"])]

        row = dict(rows=m, layers=layers)
        for name, fn in (("today", today), ("deferred", deferred),
                         ("deferred_o_only", lambda i: deferred(i, down_in_place=False)), ("in_place", in_place),
                         ("gemms_alone", gemms)):
            h.normal_()
            row[f"{name}_us"] = graph_us([fn(i) for i in range(layers)], replays=10)
        rows_out.append(row)
        print(f"rows {m:>5}: per layer today {row['today_us']:7.1f} us, deferred {row['deferred_us']:7.1f}, "
              f"deferred before the MLP only {row['deferred_o_only_us']:7.1f}, in-place adds "
              f"{row['in_place_us']:7.1f}; the four GEMMs alone {row['gemms_alone_us']:7.1f}", flush=True)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows_out),
                                                       indent=1))


if __name__ == "__main__":
    main()
