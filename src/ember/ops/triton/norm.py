"""RMSNorm, optionally fused with the residual add before it (pre-norm blocks) or after it (sandwich norms:
residual + norm(x), then an optional per-layer scale): one kernel, one pass over each row.

Rounding follows the torch reference (ember.ops.norm): the residual sum and the normalised value are rounded to
the input dtype where torch rounds them, so the kernel and the reference agree to the last bit in most rows.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ember.ops.triton import pdl
from ember.ops.triton.pdl import release_dependents, wait_prior

# EMBER_NORM_WARPS: the launch's warps per row on a GPU, for measuring (benchmarks/small_kernels.py)
WARPS_OVERRIDE = int(os.environ.get("EMBER_NORM_WARPS", "0"))


def weight_args(weight_offset: float | None) -> dict:
    """The constexprs of apply_weight for ember.ops.norm's weight_offset."""
    return dict(FLOAT_WEIGHT=weight_offset is not None, W_OFFSET=float(weight_offset or 0.0))


@triton.jit
def apply_weight(xn, w, dtype: tl.constexpr, FLOAT_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr):
    """The float32 normalised value xn times the norm weight w (float32), rounded to dtype as ember.ops.norm rounds
    it: (W_OFFSET + w) xn rounded once with FLOAT_WEIGHT, else xn rounded to dtype before w multiplies it."""
    if FLOAT_WEIGHT:
        y = xn * (W_OFFSET + w)
    else:
        y = xn.to(dtype).to(tl.float32) * w
    return y.to(dtype)


@triton.jit
def _normed(xf, w_ptr, offs, mask, n_cols, eps, dtype: tl.constexpr, FLOAT_WEIGHT: tl.constexpr,
            W_OFFSET: tl.constexpr):
    """RMSNorm of a float32 row, rounded to dtype as ember.ops.norm rounds it."""
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return apply_weight(xf * rstd, w, dtype, FLOAT_WEIGHT, W_OFFSET)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, scale_ptr, w2_ptr, n_cols, eps,
                     stride_x, stride_r, stride_o, stride_ro, stride_part,
                     BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, FLOAT_WEIGHT: tl.constexpr,
                     W_OFFSET: tl.constexpr, NUM_PARTS: tl.constexpr, POST_ADD: tl.constexpr, HAS_SCALE: tl.constexpr,
                     NEXT_NORM: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    dtype = out_ptr.dtype.element_ty
    if NUM_PARTS > 0:  # x: float32 split-K partial products [NUM_PARTS, rows, n]; their sum rounded as a GEMM's
        xs = tl.zeros([BLOCK], tl.float32)
        for p in tl.static_range(NUM_PARTS):
            xs += tl.load(x_ptr + p * stride_part + row * stride_x + offs, mask=mask, other=0.0)
        x = xs.to(dtype)
    else:
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    y = _normed(x.to(tl.float32), w_ptr, offs, mask, n_cols, eps, dtype, FLOAT_WEIGHT, W_OFFSET)
    if POST_ADD:  # residual + norm(x) [* scale], each rounded as the torch reference rounds it
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        y = (y.to(tl.float32) + r).to(dtype)
        if HAS_SCALE:
            y = (y.to(tl.float32) * tl.load(scale_ptr).to(tl.float32)).to(dtype)
        if NEXT_NORM:  # the sum is the residual stream; the next block's input norm of it is the output
            tl.store(res_out_ptr + row * stride_ro + offs, y, mask=mask)
            y = _normed(y.to(tl.float32), w2_ptr, offs, mask, n_cols, eps, dtype, FLOAT_WEIGHT, W_OFFSET)
    tl.store(out_ptr + row * stride_o + offs, y, mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            weight_offset: float | None, parts: torch.Tensor | None = None, num_warps: int | None = None,
            post_add: bool = False, scale: torch.Tensor | None = None, next_weight: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """parts: float32 [P, rows, n] split-K partial products summed in place of x (x gives the shape and dtype).
    post_add: the residual is added to the norm's output (residual + norm(x), times scale if given) instead of to
    x before it; the sum is the only output, or with next_weight the second, after its own RMSNorm."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n) if parts is None else parts
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device).view(-1, n)
    res2 = residual.reshape(-1, n) if residual is not None else out
    has_res_out = residual is not None and (not post_add or next_weight is not None)
    res_out = torch.empty_like(out) if has_res_out else out
    block = triton.next_power_of_2(n)
    num_warps = num_warps or WARPS_OVERRIDE or (4 if block <= 2048 else 8)
    _rms_norm_kernel[(out.shape[0],)](
        x2, res2, weight, out, res_out, scale if scale is not None else weight,
        next_weight if next_weight is not None else weight, n, eps,
        x2.stride(-2), res2.stride(0), out.stride(0), res_out.stride(0), x2.stride(0) if parts is not None else 0,
        BLOCK=block, HAS_RESIDUAL=residual is not None and not post_add, **weight_args(weight_offset),
        NUM_PARTS=parts.shape[0] if parts is not None else 0, POST_ADD=post_add, HAS_SCALE=scale is not None,
        NEXT_NORM=next_weight is not None, num_warps=num_warps, **pdl.launch_args(x.device),
    )
    return out.view(x.shape), (res_out.view(x.shape) if has_res_out else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float | None = None) -> torch.Tensor:
    return _launch(x, None, weight, eps, weight_offset)[0]


def rms_norm_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_offset: float | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    return _launch(x, residual, weight, eps, weight_offset, post_add=True, scale=scale)[0]


def rms_norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                          eps: float, weight_offset: float | None = None,
                          scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, residual, weight, eps, weight_offset, post_add=True, scale=scale, next_weight=next_weight)


def is_split_k_parts(x: torch.Tensor, residual: torch.Tensor) -> bool:
    """x is float32 split-K partials [S, *residual.shape] of a projection in the residual's dtype
    (ember.ops.gemm.gated_linear_parts)."""
    return x.dim() == residual.dim() + 1 and x.dtype == torch.float32 and residual.dtype != torch.float32


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_offset: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if is_split_k_parts(x, residual):
        return add_rms_norm_parts(x, residual, weight, eps, weight_offset)
    out, res = _launch(x, residual, weight, eps, weight_offset)
    return out, res


def add_rms_norm_parts(parts: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       weight_offset: float | None = None,
                       num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm of x = the sum of split-K partial products parts [P, rows, n] (float32), rounded to the
    residual's dtype first, as a GEMM's split-K reduce rounds it: the reduce kernel and this norm in one pass."""
    return _launch(residual, residual, weight, eps, weight_offset, parts=parts, num_warps=num_warps)
