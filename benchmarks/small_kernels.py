"""The small kernels between a decode step's cuBLAS GEMMs, timed where they run: SiLU-and-mul after the gate/up
GEMM, the split-K add + RMSNorm after the down projection's partial products, the greedy argmax after the LM
head and prepare_qkv (q/k norm, rotary, KV write) after the qkv projection (qwen3-8b shapes, decode rows).

Each cost is the difference between a CUDA graph of (GEMM, kernel) pairs and one of the GEMMs alone, over
distinct weight copies (from HBM, as benchmarks/gemv.py), so it includes the kernel's launch gap and the L2 state
the GEMM leaves. A sweep over launch configurations per kernel; `--best-env FILE` writes the fastest as the
environment variables the engine reads (EMBER_SILU_TILE, EMBER_NORM_WARPS, EMBER_ARGMAX_CONFIG,
EMBER_PREPARE_QKV_CONFIG), for an end-to-end A/B.

    python benchmarks/small_kernels.py [--rows 128,256] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from gemv import graph_us, weight_copies  # noqa: E402

from ember.ops.triton.activation import silu_and_mul, silu_config  # noqa: E402
from ember.ops.triton.gemm import split_k_parts  # noqa: E402
from ember.ops.triton.norm import add_rms_norm_parts  # noqa: E402
from ember.ops.triton.qkv import prepare_config, prepare_qkv  # noqa: E402
from ember.ops.triton.reduce import ARGMAX_CONFIG, row_argmax  # noqa: E402

GATE_UP, DOWN = (24576, 4096), (4096, 12288)  # qwen3-8b: N, K
SILU_TILES = [dict(BLOCK=b, ROWS=r, num_warps=w) for b, r, w in itertools.product((512, 1024, 2048, 4096),
                                                                                  (1, 2, 4), (4, 8))
              if b * r <= 8192]
NORM_WARPS = (2, 4, 8, 16, 32)
LM_HEAD = (151936, 4096)
QKV = (6144, 4096)  # 32 query heads, 8 kv heads of 128
PREPARE_CONFIGS = [dict(q_parts=p, num_warps=w) for p, w in itertools.product((0, 1, 2, 4, 8), (1, 2, 4, 8))]
ARGMAX_CONFIGS = [dict(BLOCK=b, num_warps=w, PROGRAMS_PER_SM=p)
                  for b, w, p in itertools.product((1024, 2048, 4096, 8192), (4, 8), (4, 8, 16, 32))]


def silu_sweep(m: int, ws: list) -> list[dict]:
    x = torch.randn(m, GATE_UP[1], device="cuda", dtype=torch.bfloat16)
    gemm_us = graph_us([lambda w=w: F.linear(x, w) for w in ws])
    ref = silu_and_mul(F.linear(x, ws[0]), silu_config(GATE_UP[0] // 2, m))
    rows = []
    for cfg in SILU_TILES:
        assert torch.equal(silu_and_mul(F.linear(x, ws[0]), cfg), ref), cfg
        us = graph_us([lambda w=w: silu_and_mul(F.linear(x, w), cfg) for w in ws]) - gemm_us
        rows.append(dict(kernel="silu_and_mul", m=m, config=cfg, us=us))
    return rows


def norm_sweep(m: int, ws: list) -> list[dict]:
    x = torch.randn(m, DOWN[1], device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, DOWN[0], device="cuda", dtype=torch.bfloat16)
    nw = torch.randn(DOWN[0], device="cuda", dtype=torch.bfloat16)
    gemm_us = graph_us([lambda w=w: split_k_parts(x, w, 2) for w in ws])
    ref = add_rms_norm_parts(split_k_parts(x, ws[0], 2), res, nw, 1e-6)
    rows = []
    for warps in NORM_WARPS:
        out = add_rms_norm_parts(split_k_parts(x, ws[0], 2), res, nw, 1e-6, num_warps=warps)
        assert torch.equal(out[1], ref[1]) and torch.allclose(out[0], ref[0], rtol=1e-2, atol=1e-2), warps
        us = graph_us([lambda w=w: add_rms_norm_parts(split_k_parts(x, w, 2), res, nw, 1e-6, num_warps=warps)
                       for w in ws]) - gemm_us
        rows.append(dict(kernel="add_rms_norm_parts", m=m, config=dict(num_warps=warps), us=us))
    return rows


def argmax_sweep(m: int, ws: list) -> list[dict]:
    """The argmax over [m, vocab] bf16 logits just written by the LM head (L2 holds their tail, as in a step)."""
    x = torch.randn(m, LM_HEAD[1], device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(m, LM_HEAD[0], device="cuda", dtype=torch.bfloat16)
    gemm_us = graph_us([lambda w=w: torch.matmul(x, w.t(), out=logits) for w in ws])
    torch.matmul(x, ws[0].t(), out=logits)
    ref = logits.argmax(-1)
    rows = []
    for cfg in ARGMAX_CONFIGS:
        torch.matmul(x, ws[0].t(), out=logits)  # the graphs below leave the last weight's logits
        assert torch.equal(row_argmax(logits, cfg), ref), cfg
        us = graph_us([lambda w=w: (torch.matmul(x, w.t(), out=logits), row_argmax(logits, cfg)) for w in ws]) - gemm_us
        rows.append(dict(kernel="row_argmax", m=m, config=cfg, us=us))
    return rows


def prepare_sweep(m: int, ws: list) -> list[dict]:
    """prepare_qkv after the qkv GEMM: 32 q heads and 8 kv heads of 128 (norms, rotary), m tokens into distinct
    slots of a paged pool."""
    heads, kv_heads, d, bs = 32, 8, 128, 16
    x = torch.randn(m, QKV[1], device="cuda", dtype=torch.bfloat16)
    qkv = torch.empty(m, QKV[0], device="cuda", dtype=torch.bfloat16)
    pool = torch.zeros(2, m // bs + 1, bs, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, 4096, (m,), device="cuda")
    slots = torch.randperm(m, device="cuda")
    qw, kw = (1 + 0.1 * torch.randn(2, d, device="cuda")).to(torch.bfloat16)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.arange(4096, device="cuda").float()[:, None] * inv[None, :]
    cos_sin = torch.cat([emb.cos(), emb.cos(), emb.sin(), emb.sin()], -1)
    args = (positions, pool, slots, heads, kv_heads, qw, kw, 1e-6, cos_sin, d)

    def step(w, cfg):
        torch.matmul(x, w.t(), out=qkv)
        prepare_qkv(qkv, *args, config=cfg)

    gemm_us = graph_us([lambda w=w: torch.matmul(x, w.t(), out=qkv) for w in ws])
    step(ws[0], dict(q_parts=0, num_warps=4))
    ref, ref_pool = qkv.clone(), pool.clone()
    rows = []
    for cfg in PREPARE_CONFIGS:
        step(ws[0], cfg)
        # the per-head norm's reduction order follows the warps: equal up to bf16 rounding
        assert torch.allclose(qkv.float(), ref.float(), rtol=1e-2, atol=1e-2), cfg
        assert torch.allclose(pool.float(), ref_pool.float(), rtol=1e-2, atol=1e-2), cfg
        us = graph_us([lambda w=w: step(w, cfg) for w in ws]) - gemm_us
        rows.append(dict(kernel="prepare_qkv", m=m, config=cfg, us=us))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,256")
    ap.add_argument("--best-env", default=None, help="write the fastest configs at the largest rows as env vars")
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", default="silu,norm,argmax,prepare")
    args = ap.parse_args()
    ms = [int(r) for r in args.rows.split(",")]
    results = []
    sweeps = dict(silu=(GATE_UP, silu_sweep), norm=(DOWN, norm_sweep), argmax=(LM_HEAD, argmax_sweep),
                  prepare=(QKV, prepare_sweep))
    for shape, sweep in (sweeps[k] for k in args.kernels.split(",")):
        ws = weight_copies(*shape, 512 * 2**20)
        for m in ms:
            rows = sweep(m, ws)
            results += rows
            rows.sort(key=lambda r: r["us"])
            print(f"{rows[0]['kernel']} M={m}: " + "; ".join(f"{r['config']} {r['us']:.2f} us" for r in rows[:4])
                  + f" ... worst {rows[-1]['us']:.2f}", flush=True)
        del ws
        torch.cuda.empty_cache()
    defaults = dict(silu_and_mul=lambda m: silu_config(GATE_UP[0] // 2, m), row_argmax=lambda m: ARGMAX_CONFIG,
                    prepare_qkv=lambda m: prepare_config(m))
    for m in ms:
        for kernel, default in defaults.items():
            base = [r for r in results if r["m"] == m and r["kernel"] == kernel and r["config"] == default(m)]
            if base:
                print(f"M={m}: default {kernel} {default(m)} {base[0]['us']:.2f} us")
    if args.best_env:
        top = max(ms)

        def best(kernel):
            rows = [r for r in results if r["m"] == top and r["kernel"] == kernel]
            return min(rows, key=lambda r: r["us"])["config"] if rows else None

        env = []
        if c := best("silu_and_mul"):
            env.append(f"EMBER_SILU_TILE={c['BLOCK']},{c['ROWS']},{c['num_warps']}")
        if c := best("add_rms_norm_parts"):
            env.append(f"EMBER_NORM_WARPS={c['num_warps']}")
        if c := best("row_argmax"):
            env.append(f"EMBER_ARGMAX_CONFIG={c['BLOCK']},{c['num_warps']},{c['PROGRAMS_PER_SM']}")
        if c := best("prepare_qkv"):
            env.append(f"EMBER_PREPARE_QKV_CONFIG={c['q_parts']},{c['num_warps']}")
        Path(args.best_env).write_text("".join(f"export {e}\n" for e in env))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=results),
                                                       indent=1))


if __name__ == "__main__":
    main()
