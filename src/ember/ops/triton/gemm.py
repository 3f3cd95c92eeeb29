"""Skinny GEMM for decode: y = x W^T (+ b) for up to SKINNY_MAX_M rows of x, streaming W once at near the memory
bandwidth, optionally applying a gated MLP's activation to a fused gate/up input on the way in.

At batch 1-16 a decode step is a string of matrix-vector products bound by reading the weights. cuBLAS picks
split-K kernels for these shapes (a second reduce kernel, and 73-86% of bandwidth for the 8B shape's qkv/o/down
projections; ~1.1-2 TB/s at K=1024). Here each program owns BLOCK_N output features over all of K: no reduce, no
workspace, one launch. One row of x accumulates elementwise into a [BLOCK_N, BLOCK_K] tile reduced once at the
end; several rows use tl.dot with x padded to 16 rows (the padding costs compute, not bandwidth).

The fused activation reads gate and up halves of x, rounds act(gate) and act(gate) * up to x's dtype as the
torch reference (ember.ops.activation.gated) does, and feeds that to the product: the separate activation kernel
and its [M, I] round trip disappear. Larger inputs fall back to cuBLAS (F.linear), unfused.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ember.ops.activation import gated

SKINNY_MAX_M = 16
ACT_CODES = {None: 0, "silu": 1, "gelu_pytorch_tanh": 2, "gelu_new": 2, "gelu": 3}


@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == 1:
        return x * tl.sigmoid(x)
    elif ACT == 2:  # tanh approximation: 0.5 x (1 + tanh(u)) = x * sigmoid(2u)
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    else:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def _load_x(x_ptr, offs_m, k, K, stride_xm, m_mask, k_mask, ACT: tl.constexpr):
    mask = m_mask[:, None] & k_mask[None, :]
    ptrs = x_ptr + offs_m[:, None] * stride_xm + k[None, :]
    x = tl.load(ptrs, mask=mask, other=0.0)
    if ACT != 0:
        dtype = x.dtype
        up = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        act = _act(x.to(tl.float32), ACT).to(dtype).to(tl.float32)
        x = (act * up).to(dtype)
    return x


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                   ACT: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask, m_mask = offs_n < N, offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)  # [BN, BK]
        x = _load_x(x_ptr, offs_m, k, K, stride_xm, m_mask, k_mask, ACT)  # [BM, BK]
        if USE_DOT:
            if IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        else:
            acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def skinny_config(m: int, n: int, k: int) -> dict:
    """Tile sizes by shape. One row: elementwise accumulation, narrow BLOCK_N so that even N=1024 spreads over
    every SM; several rows: tl.dot on 16-row tiles."""
    if m == 1:
        block_n = 4 if n >= 4096 else 2 if n >= 2048 else 1
        return dict(BLOCK_M=1, BLOCK_N=block_n, BLOCK_K=min(1024, triton.next_power_of_2(k)), USE_DOT=False,
                    num_warps=4, num_stages=3)
    return dict(BLOCK_M=16, BLOCK_N=16 if n < 8192 else 32, BLOCK_K=min(256, max(16, triton.next_power_of_2(k))),
                USE_DOT=True, num_warps=4, num_stages=3)


def launch_skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None,
                  config: dict | None = None) -> torch.Tensor:
    """x: [M, K] (or [M, 2K] with act), M <= SKINNY_MAX_M, unit stride in K; weight [N, K] row-major."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    cfg = dict(config or skinny_config(m, n, k))
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]),)
    _skinny_kernel[grid](x, weight, bias if bias is not None else weight, out, m, n, k, x.stride(0),
                         weight.stride(0), out.stride(0), ACT=ACT_CODES[act], HAS_BIAS=bias is not None,
                         IEEE=x.dtype == torch.float32, **cfg)
    return out


def _skinny_ok(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    return (0 < x2.shape[0] <= SKINNY_MAX_M and weight.dim() == 2 and weight.stride(1) == 1
            and x2.dtype == weight.dtype and x2.dtype in (torch.bfloat16, torch.float16, torch.float32))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if not _skinny_ok(x2, weight):
        return F.linear(x, weight, bias)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    return launch_skinny(x2, weight, bias, None).view(*x.shape[:-1], weight.shape[0])


def gated_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act: str = "silu") -> torch.Tensor:
    x2 = gate_up.reshape(-1, gate_up.shape[-1])
    if act not in ACT_CODES or not _skinny_ok(x2, weight):
        if act == "silu":
            from ember.ops.triton.activation import silu_and_mul
            return F.linear(silu_and_mul(gate_up), weight, bias)
        return F.linear(gated(gate_up, act), weight, bias)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    return launch_skinny(x2, weight, bias, act).view(*gate_up.shape[:-1], weight.shape[0])
