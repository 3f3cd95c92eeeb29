"""GEMV for batch-1 decode: y = x W^T (+ b) for one row of x, streaming W once at near the memory bandwidth, with
the op before it optionally fused into its prologue: a gated MLP's activation over a fused gate/up input, or the
RMSNorm (and residual add) of the block's input.

At batch 1 a decode step is a string of matrix-vector products bound by reading the weights, plus small kernels
between them. cuBLAS picks split-K kernels for the smaller shapes (a second reduce kernel; ~1.1-2 TB/s at K=1024).
Here each program owns BLOCK_N output features over all of K (no reduce, no workspace, one launch) and accumulates
a [BLOCK_N, BLOCK_K] tile elementwise, reduced once at the end. The fused prologues recompute their tiny input
(K values, from L2) in every program rather than launching a kernel for it and paying its launch gap:

- gated: reads the gate and up halves and rounds act(gate) and act(gate) * up to the input dtype as the torch
  reference (ember.ops.activation.gated) does;
- norm: a first pass over x (+ residual) for the mean square, then the normalised value rounded as
  ember.ops.norm rounds it; program 0 also stores x + residual, the residual stream the next block adds to;
- norm then add (a sandwich norm, Gemma): residual + norm(x) is both this projection's input and, stored by
  program 0, the residual stream;
- act_mul: act(gate) * up over two separate inputs (Gemma 4's per-layer input gate before its projection).

Inputs of more than one row go to cuBLAS (F.linear) with the separate Triton norm/activation kernels.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ember.ops.activation import gated
from ember.ops.triton.activation import ACT_CODES, act_fn, act_mul, silu_and_mul
from ember.ops.triton import pdl
from ember.ops.triton.norm import add_rms_norm, apply_weight, rms_norm, rms_norm_add, weight_args
from ember.ops.triton.pdl import release_dependents, wait_prior

# The norm prologue re-reads x (+ residual, + norm weight) in every program: ~40 KB per program against ~32 KB of
# weight tile. Where launch latency dominates (small projections, e.g. qwen3-0.6b's) fusing saves a kernel and its
# gap (qkv 5.2 vs 6.9 us); on bandwidth-bound ones the extra L2 traffic costs more (qwen3-8b gate_up 56.5 vs 52.2
# us), so those run the norm kernel and then the GEMV.
NORM_FUSE_MAX_WEIGHT = 8 * 2**20  # elements
# A gated MLP's down projection before the next residual add + RMSNorm, at decode batch sizes: cuBLAS runs
# qwen3-8b's (K=12288) as a split-K GEMM plus a reduce kernel, and the norm kernel then reads the reduced output.
# Splitting K ourselves (a batched GEMM into float32 partials) and summing the partials in the norm kernel saves
# the reduce kernel and its launch gap: 46.8 -> 42.6 us per layer at batch 256, 36.1 -> 34.0 at 128 for qwen3-8b;
# 9.9 -> 8.5 for qwen3-0.6b (K=3072) at 256; a wash at 64 (benchmarks/splitk_norm.py on an H200). Larger inputs
# (prefill) do not split in cuBLAS, and the float32 partials would only add traffic. EMBER_SPLIT_K_PARTS=0: off.
SPLIT_K_PARTS = int(os.environ.get("EMBER_SPLIT_K_PARTS", "2"))
SPLIT_K_ROWS = (128, 512)
ADD_NORM = tl.constexpr(1)  # the GEMV's NORM prologues: norm(x + residual) (pre-norm blocks)
NORM_ADD = tl.constexpr(2)  # residual + norm(x) (sandwich norms)


@triton.jit
def _gemv_kernel(x_ptr, up_ptr, w_ptr, b_ptr, out_ptr, res_ptr, res_out_ptr, nw_ptr, N, K, eps, stride_wn,
                 ACT: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, FLOAT_WEIGHT: tl.constexpr,
                 W_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 USE_PDL: tl.constexpr):
    """NORM: 0 none, ADD_NORM norm(x + residual), NORM_ADD residual + norm(x); ACT != 0: act(x) * up."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    dtype = x_ptr.dtype.element_ty
    # the first weight tile is loaded before waiting on the kernel before: weights are no kernel's output, so with
    # PDL this load overlaps that kernel's tail; each iteration below then loads the next tile
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k < K)[None, :], other=0.0)
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    rstd = 0.0
    if NORM != 0:  # pass 1: the mean square of what is normed (with ADD_NORM the residual sum, stored once)
        sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            k_mask = k < K
            s = tl.load(x_ptr + k, mask=k_mask, other=0.0)
            if HAS_RES and NORM == ADD_NORM:
                s = (s.to(tl.float32) + tl.load(res_ptr + k, mask=k_mask, other=0.0).to(tl.float32)).to(dtype)
                if pid == 0:
                    tl.store(res_out_ptr + k, s, mask=k_mask)
            sf = s.to(tl.float32)
            sq += sf * sf
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0)
        if NORM != 0:  # each add rounded to dtype as the torch reference rounds it
            if HAS_RES and NORM == ADD_NORM:
                x = (x.to(tl.float32) + tl.load(res_ptr + k, mask=k_mask, other=0.0).to(tl.float32)).to(dtype)
            nw = tl.load(nw_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            x = apply_weight(x.to(tl.float32) * rstd, nw, dtype, FLOAT_WEIGHT, W_OFFSET)
            if NORM == NORM_ADD:
                x = (x.to(tl.float32) + tl.load(res_ptr + k, mask=k_mask, other=0.0).to(tl.float32)).to(dtype)
                if pid == 0:
                    tl.store(res_out_ptr + k, x, mask=k_mask)
        elif ACT != 0:
            up = tl.load(up_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            x = (act_fn(x.to(tl.float32), ACT).to(dtype).to(tl.float32) * up).to(dtype)
        acc += x.to(tl.float32)[None, :] * w.to(tl.float32)
        k_next = k + BLOCK_K  # all masked on the last iteration: no memory traffic
        w = tl.load(w_rows + k_next[None, :], mask=n_mask[:, None] & (k_next < K)[None, :], other=0.0)
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


def gemv_config(n: int, k: int, has_act: bool = False) -> dict:
    """Tile sizes by shape, from a tile sweep on an H200 (benchmarks/gemv.py --sweep; first sweep in
    benchmarks/results/2026-12-03-h200-skinny_gemm-sweep.json): narrow BLOCK_N so that even N=1024
    spreads over every SM, wide BLOCK_K for long contiguous reads, deeper pipelines for long K. A long K over fewer
    than 4096 outputs (gemma4-default's down projection, 2304 x 9216) wants twice the programs and twice the warps:
    15.8 against 19.1 us on an H100, with the SiLU or the GELU prologue (results/2026-12-05-h100-gemv-down.txt)."""
    if k >= 8192:
        if n < 4096:
            return dict(BLOCK_N=4, BLOCK_K=1024, num_warps=8, num_stages=1)
        return dict(BLOCK_N=8, BLOCK_K=1024, num_warps=4, num_stages=4)
    if n <= 1024:
        if has_act:
            return dict(BLOCK_N=2, BLOCK_K=1024, num_warps=8, num_stages=1)
        return dict(BLOCK_N=4, BLOCK_K=min(2048, triton.next_power_of_2(k)), num_warps=4, num_stages=1)
    return dict(BLOCK_N=4, BLOCK_K=min(1024, triton.next_power_of_2(k)), num_warps=4, num_stages=3)


def launch_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None,
                norm: tuple | None = None, config: dict | None = None, up: torch.Tensor | None = None,
                norm_add: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [1, K] contiguous; weight [N, K] row-major. act: the input is act(x) * up, up [1, K] with unit stride
    (default: x is [1, 2K], gate then up). norm: (residual or None, norm weight, eps, weight_offset as in
    ember.ops.norm): the input is norm(x + residual), or residual + norm(x) with norm_add. Returns ([1, N] output,
    [1, K] residual stream out if a residual was given)."""
    n, k = weight.shape
    cfg = dict(config or gemv_config(n, k, act is not None))
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    residual, nw, eps, weight_offset = norm if norm is not None else (None, None, 0.0, None)
    assert residual is not None or not norm_add, "norm_add needs a residual"
    res_out = torch.empty(1, k, dtype=x.dtype, device=x.device) if residual is not None else None
    if act and up is None:
        up = x[:, k:]
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, up if up is not None else x, weight, bias if bias is not None else weight, out,
        residual if residual is not None else x, res_out if res_out is not None else out,
        nw if nw is not None else weight, n, k, eps, weight.stride(0),
        ACT=ACT_CODES[act] if act else 0, NORM=0 if norm is None else (NORM_ADD if norm_add else ADD_NORM).value,
        HAS_RES=residual is not None, **weight_args(weight_offset), HAS_BIAS=bias is not None, **cfg,
        **pdl.launch_args(x.device))
    return out, res_out


def _gemv_ok(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x2.shape[0] == 1 and weight.dim() == 2 and weight.stride(1) == 1 and x2.dtype == weight.dtype
            and x2.dtype in (torch.bfloat16, torch.float16, torch.float32))


def _gated_input(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up of a fused gate/up projection, as a separate kernel before a cuBLAS projection."""
    return silu_and_mul(gate_up) if act == "silu" else gated(gate_up, act)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if not _gemv_ok(x2, weight):
        return F.linear(x, weight, bias)
    return launch_gemv(x2.contiguous(), weight, bias)[0].view(*x.shape[:-1], weight.shape[0])


def gated_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act: str = "silu") -> torch.Tensor:
    x2 = gate_up.reshape(-1, gate_up.shape[-1])
    if act not in ACT_CODES or not _gemv_ok(x2, weight):
        return F.linear(_gated_input(gate_up, act), weight, bias)
    return launch_gemv(x2.contiguous(), weight, bias, act=act)[0].view(*gate_up.shape[:-1], weight.shape[0])


def act_mul_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   act: str = "silu") -> torch.Tensor:
    g2, u2 = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
    if act not in ACT_CODES or not _gemv_ok(g2, weight) or u2.dtype != g2.dtype:
        return F.linear(act_mul(gate, up, act), weight, bias)
    u2 = u2 if u2.stride(-1) == 1 else u2.contiguous()
    return launch_gemv(g2.contiguous(), weight, bias, act=act, up=u2)[0].view(*gate.shape[:-1], weight.shape[0])


def linear_add(x: torch.Tensor, weight: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """cuBLAS accumulates into the stream (beta = 1): the residual add rides in the GEMM's epilogue."""
    return stream.addmm_(x.reshape(-1, x.shape[-1]), weight.t())


def gated_linear_add(gate_up: torch.Tensor, weight: torch.Tensor, stream: torch.Tensor,
                     act: str = "silu") -> torch.Tensor:
    return linear_add(_gated_input(gate_up, act), weight, stream)


def split_k_parts(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """[S, rows, N] float32 partial products of x [rows, K] @ weight[N, K]^T over S slices of K, by one batched
    GEMM over strided views (no copies)."""
    rows, k = x.shape
    xs = x.view(rows, splits, k // splits).transpose(0, 1)
    ws = weight.view(weight.shape[0], splits, k // splits).permute(1, 2, 0)
    if not x.is_cuda:  # the Triton interpreter tests: no float32-output bmm on CPU
        return torch.bmm(xs.float(), ws.float())
    return torch.bmm(xs, ws, out_dtype=torch.float32)


def gated_linear_parts(gate_up: torch.Tensor, weight: torch.Tensor, act: str = "silu") -> torch.Tensor:
    x2 = gate_up.reshape(-1, gate_up.shape[-1])
    k, s = weight.shape[1], SPLIT_K_PARTS
    if (s > 1 and act == "silu" and SPLIT_K_ROWS[0] <= x2.shape[0] <= SPLIT_K_ROWS[1] and k % (8 * s) == 0
            and weight.stride(1) == 1 and x2.dtype in (torch.bfloat16, torch.float16) and gate_up.dim() == 2):
        return split_k_parts(silu_and_mul(x2), weight, s)
    return gated_linear(gate_up, weight, None, act)


def rms_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, bias: torch.Tensor | None = None,
                    weight_offset: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    # split-K partials (gated_linear_parts: float32, several rows) are never a GEMV input; add_rms_norm sums them
    if not _gemv_ok(x2, weight) or weight.numel() > NORM_FUSE_MAX_WEIGHT:
        if residual is None:
            h, residual = rms_norm(x, norm_weight, eps, weight_offset), x
        else:
            h, residual = add_rms_norm(x, residual, norm_weight, eps, weight_offset)
        return linear(h, weight, bias), residual
    res2 = residual.reshape(1, -1).contiguous() if residual is not None else None
    out, res_out = launch_gemv(x2.contiguous(), weight, bias, norm=(res2, norm_weight, eps, weight_offset))
    return out.view(*x.shape[:-1], weight.shape[0]), (res_out.view(x.shape) if res_out is not None else x)


def rms_norm_add_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None = None,
                        weight_offset: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    if not _gemv_ok(x2, weight) or weight.numel() > NORM_FUSE_MAX_WEIGHT or residual.dtype != x.dtype:
        h = rms_norm_add(x, residual, norm_weight, eps, weight_offset)
        return linear(h, weight, bias), h
    out, h = launch_gemv(x2.contiguous(), weight, bias, norm=(residual.reshape(1, -1).contiguous(), norm_weight, eps,
                                                               weight_offset), norm_add=True)
    return out.view(*x.shape[:-1], weight.shape[0]), h.view(x.shape)
