"""The elementwise parts of a Gated DeltaNet layer around its delta rule, one launch each (signatures of the torch
references ember.ops.activation.gdn_gating and ember.ops.norm.gated_rms_norm):

- gdn_gating: the per-head log decay g = -exp(A_log) * softplus(a + dt_bias) (float32) and write strength
  beta = sigmoid(b), for tiles of [ROWS tokens, BLOCK_H heads]; about seven launches in the reference.
- gated_rms_norm: the output norm RMSNorm(x) * w * silu(gate) over rows of head_v_dim, ROWS rows a program. x and
  gate are read through [token, head] strides, so the gate can stay a view of the fused in_proj output (about a
  dozen launches in the reference, and a copy of the gate whenever a step has more than one token).

Rounding follows the references: beta and the normalised row, its product with the weight and the gated output
are rounded to the model dtype where torch rounds them; g, the statistics and the gate's SiLU stay in float32.
The transcendental functions (exp, log) are not torch's, so float32 results agree to a few ulp, not to the bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops.triton import pdl
from ember.ops.triton.overrides import env_launch
from ember.ops.triton.pdl import release_dependents, wait_prior

# EMBER_GATED_NORM_TILE="ROWS,num_warps": the norm's launch on a GPU, for measuring (benchmarks/small_kernels.py)
NORM_TILE_OVERRIDE = env_launch("EMBER_GATED_NORM_TILE", ("ROWS", "num_warps"))


@triton.jit
def _softplus(x):
    """torch's softplus (beta 1, threshold 20): x above 20, else log1p(exp(x))."""
    e = tl.exp(tl.where(x > 20.0, 20.0, x))
    u = 1.0 + e
    d = u - 1.0
    # log1p(e) = log(u) * e / (u - 1) (Goldberg), exact to a few ulp where 1 + e loses e's low bits; e where u == 1
    log1p = tl.where(d == 0.0, e, tl.log(u) * (e / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _gdn_gating_kernel(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, num_tokens, num_heads,
                       stride_a, stride_b, stride_g, stride_beta,
                       ROWS: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    mask = (rows < num_tokens)[:, None] & head_mask[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    a = tl.load(a_ptr + rows64 * stride_a + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows64 * stride_b + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    decay_rate = tl.exp(tl.load(a_log_ptr + heads, mask=head_mask, other=0.0).to(tl.float32))  # [BLOCK_H]
    dt_bias = tl.load(dt_bias_ptr + heads, mask=head_mask, other=0.0).to(tl.float32)
    g = -decay_rate[None, :] * _softplus(a + dt_bias[None, :])
    tl.store(g_ptr + rows64 * stride_g + heads[None, :], g, mask=mask)
    tl.store(beta_ptr + rows64 * stride_beta + heads[None, :], tl.sigmoid(b).to(beta_ptr.dtype.element_ty),
             mask=mask)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num_heads = a.shape[-1]
    assert b.shape == a.shape and A_log.shape == dt_bias.shape == (num_heads,)
    assert A_log.is_contiguous() and dt_bias.is_contiguous()
    a2, b2 = (t.reshape(-1, num_heads) for t in (a, b))
    a2, b2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (a2, b2))
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    num_tokens = a2.shape[0]
    if num_tokens == 0:
        return g, beta
    g2, beta2 = g.view(-1, num_heads), beta.view(-1, num_heads)
    block_h = min(1024, triton.next_power_of_2(num_heads))
    rows = max(1, 1024 // block_h)  # a decode step's tokens in one program; a prefill's in programs of 1024 gates
    grid = (triton.cdiv(num_tokens, rows), triton.cdiv(num_heads, block_h))
    _gdn_gating_kernel[grid](a2, b2, A_log, dt_bias, g2, beta2, num_tokens, num_heads,
                             a2.stride(0), b2.stride(0), g2.stride(0), beta2.stride(0),
                             ROWS=rows, BLOCK_H=block_h, num_warps=4, **pdl.launch_args(a.device))
    return g, beta


@triton.jit
def _gated_rms_norm_kernel(x_ptr, gate_ptr, w_ptr, out_ptr, num_rows, num_heads, n_cols, eps,
                           stride_xt, stride_xh, stride_gt, stride_gh,
                           ROWS: tl.constexpr, BLOCK: tl.constexpr, ROUND_PRODUCT: tl.constexpr,
                           USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # row = token * num_heads + head
    tok, head = (rows // num_heads).to(tl.int64), rows % num_heads
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    mask = (rows < num_rows)[:, None] & col_mask[None, :]
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + (tok * stride_xt + head * stride_xh)[:, None] + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)  # [ROWS, BLOCK]
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = (x * rstd[:, None]).to(dtype).to(tl.float32) * w[None, :]
    if ROUND_PRODUCT:  # weight * normed is in the model dtype unless the weight is wider
        y = y.to(dtype).to(tl.float32)
    gate = tl.load(gate_ptr + (tok * stride_gt + head * stride_gh)[:, None] + cols[None, :], mask=mask,
                   other=0.0).to(tl.float32)
    y = y * (gate / (1.0 + tl.exp(-gate)))  # silu as torch writes it
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * n_cols + cols[None, :], y.to(dtype), mask=mask)


def _norm_config(num_rows: int, block: int) -> dict:
    if NORM_TILE_OVERRIDE:
        return dict(NORM_TILE_OVERRIDE)
    # one row a program while rows are few (a decode step's tokens x heads), up to 2048 elements once there are
    # enough programs to fill the GPU anyway
    rows = 1
    while rows * block < 2048 and num_rows >= 512 * rows:
        rows *= 2
    return dict(ROWS=rows, num_warps=4 if rows * block <= 4096 else 8)


def _by_head(t: torch.Tensor) -> torch.Tensor:
    """[..., H, N] (or [..., N], as H = 1) as [T, H, N] with unit stride in N; a view where torch can make one."""
    t3 = t.reshape(-1, t.shape[-2] if t.dim() >= 3 else 1, t.shape[-1])
    return t3 if t3.stride(-1) == 1 else t3.contiguous()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    assert gate.shape == x.shape and weight.shape == (n,) and weight.is_contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x3, g3 = _by_head(x), _by_head(gate)
    num_heads = x3.shape[1]
    num_rows = x3.shape[0] * num_heads
    if num_rows == 0:
        return out
    block = triton.next_power_of_2(n)
    cfg = _norm_config(num_rows, block)
    _gated_rms_norm_kernel[(triton.cdiv(num_rows, cfg["ROWS"]),)](
        x3, g3, weight, out, num_rows, num_heads, n, eps, x3.stride(0), x3.stride(1), g3.stride(0), g3.stride(1),
        BLOCK=block, ROUND_PRODUCT=torch.promote_types(weight.dtype, x.dtype) == x.dtype, **cfg,
        **pdl.launch_args(x.device),
    )
    return out
