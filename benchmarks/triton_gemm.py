"""Triton GEMMs at decode batch sizes against cuBLAS: could ember replace cuBLAS's projections at 128-256 rows
with its own kernels, to fuse the small kernels around them (SiLU-and-mul into the gate/up projection's epilogue)
and chain them with programmatic dependent launch?

Two Triton kernels, each with an optional gated epilogue (act(gate) * up from two accumulators, rounded as
ember.ops.activation.gated rounds, so the separate SiLU kernel and its launch go away):
- `pointer`: one output tile per program, pointer loads pipelined by the compiler;
- `tma`: tensor-descriptor (TMA) loads, optionally persistent (one program per SM walking the tiles).
The peer is F.linear (cuBLAS), plus ember's Triton silu_and_mul for the gated case. Each timing replays a CUDA
graph over distinct weight copies (>= 768 MB, from HBM) as benchmarks/gemv.py does, with PDL off and on.

    python benchmarks/triton_gemm.py [--rows 128,256] [--out benchmarks/results/NAME]

Result on an H200 (results/2026-12-03-h200-triton-gemm-*.log): the best Triton tile is 35-60% slower than cuBLAS
for every qwen3-8b projection (gate/up at 256 rows: 102.8 us fused against 77.9 us for cuBLAS + SiLU), so ember
keeps cuBLAS for batched projections.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from gemv import fastest, graph_us, weight_copies  # noqa: E402

from ember.ops.triton import pdl  # noqa: E402
from ember.ops.triton.activation import silu_and_mul  # noqa: E402
from ember.ops.triton.pdl import release_dependents, wait_prior  # noqa: E402

SHAPES = {"gate_up": (24576, 4096, True), "qkv": (6144, 4096, False), "o": (4096, 4096, False),
          "down": (4096, 12288, False)}  # qwen3-8b: N (both halves for gate/up), K, gated


@triton.jit
def _epilogue(acc, acc_u, dtype, GATED: tl.constexpr):
    if GATED:  # the GEMM outputs rounded to the model dtype first, as the unfused path stores them
        g = acc.to(dtype).to(tl.float32)
        act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
        return (act * acc_u.to(dtype).to(tl.float32)).to(dtype)
    return acc.to(dtype)


@triton.jit
def _pointer_kernel(x_ptr, w_ptr, out_ptr, M, N, K, n_half, stride_xm, stride_wn, stride_om, GATED: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % num_m  # the row tiles of one weight tile side by side: it is read from HBM once
    pid_n = tl.program_id(0) // num_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        acc = tl.dot(a, tl.trans(tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)), acc)
        if GATED:
            u = tl.load(w_ptrs + n_half * stride_wn, mask=n_mask[:, None], other=0.0)
            acc_u = tl.dot(a, tl.trans(u), acc_u)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y = _epilogue(acc, acc_u, out_ptr.dtype.element_ty, GATED)
    tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :], y,
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _tma_kernel(x_desc, w_desc, o_desc, M, N, K, n_half, GATED: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGS: tl.constexpr, USE_PDL: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    for tile in tl.range(tl.program_id(0), num_m * tl.cdiv(N, BLOCK_N), NUM_PROGS, flatten=True):
        om, on = (tile % num_m) * BLOCK_M, (tile // num_m) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = x_desc.load([om, k0])
            acc = tl.dot(a, w_desc.load([on, k0]).T, acc)
            if GATED:
                acc_u = tl.dot(a, w_desc.load([n_half + on, k0]).T, acc_u)
        o_desc.store([om, on], _epilogue(acc, acc_u, o_desc.dtype, GATED))


def triton_gemm(x: torch.Tensor, w: torch.Tensor, gated: bool, cfg: dict) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T, or act(x @ gate^T) * (x @ up^T) for a fused [2I, K] gate/up weight."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    cfg = dict(cfg)
    kind, persistent = cfg.pop("kind"), cfg.pop("persistent", False)
    m, k = x.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    assert k % bk == 0, (k, bk)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if kind == "pointer":
        _pointer_kernel[(tiles,)](x, w, out, m, n, k, n, x.stride(0), w.stride(0), out.stride(0), GATED=gated,
                                  **cfg, **pdl.launch_args(x.device))
    else:
        progs = min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count) if persistent else tiles
        _tma_kernel[(progs,)](TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                              TensorDescriptor.from_tensor(out, [bm, bn]), m, n, k, n, GATED=gated, NUM_PROGS=progs,
                              **cfg, **pdl.launch_args(x.device))
    return out


def configs(gated: bool):
    tiles = ([(128, 64, 64, 8, 4), (128, 64, 64, 8, 3), (128, 64, 128, 8, 3), (128, 128, 64, 8, 4), (64, 64, 64, 4, 4),
              (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 128, 4, 3)] if gated else
             [(128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 64, 64, 4, 5), (64, 128, 64, 4, 4),
              (64, 64, 64, 4, 5), (64, 64, 128, 4, 4), (128, 128, 128, 8, 3), (64, 128, 128, 4, 3)])
    for kind, persistent in (("pointer", False), ("tma", False), ("tma", True)):
        for bm, bn, bk, w, s in tiles:
            yield dict(kind=kind, persistent=persistent, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w,
                       num_stages=s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,256")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for name in args.shapes.split(","):
        n, k, gated = SHAPES[name]
        ws = weight_copies(n, k, 768 * 2**20)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device=dev, dtype=dt)

            def cublas(w):
                return silu_and_mul(F.linear(x, w)) if gated else F.linear(x, w)

            ref = cublas(ws[0]).float()
            row = dict(shape=name, m=m, n=n, k=k, gated=gated, cublas_us=graph_us([lambda w=w: cublas(w) for w in ws]))

            def time_us(cfg: dict) -> float:
                err = ((triton_gemm(x, ws[0], gated, cfg).float() - ref).abs().max() / ref.abs().max()).item()
                pdl.set_enabled(False)
                try:
                    t = graph_us([lambda w=w: triton_gemm(x, w, gated, cfg) for w in ws])
                finally:
                    pdl.set_enabled(None)
                tqdm.write(f"{name} m={m} {cfg}: {t:7.1f} us (cuBLAS {row['cublas_us']:7.1f}) err {err:.1e}")
                return t

            row["best_us"], row["best"] = fastest((float("inf"), None), tqdm(list(configs(gated)), desc=name), time_us)
            row["ratio"] = row["best_us"] / row["cublas_us"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    for r in rows:
        print(f"{r['shape']:>8} M={r['m']:<4} cuBLAS {r['cublas_us']:7.1f} us  best Triton {r['best_us']:7.1f} us "
              f"({r['ratio']:.2f}x)  {r['best']}")
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
