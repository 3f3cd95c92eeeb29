"""Reference RMSNorm (Zhang & Sennrich, arXiv:1910.07467) as the Llama/Qwen family computes it: statistics in
float32, the normalised value cast back to the input dtype before the weight multiplies it."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """x: [..., N] -> [..., N]; unit_offset: Gemma-style weights stored as (scale - 1)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (xf * (1.0 + weight.float())).to(dtype)
    return weight * xf.to(dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x, weight) * silu(gate) over the last dim, x and gate [..., N] (a Gated DeltaNet layer's output
    norm, Qwen3_5RMSNormGated): the gate's SiLU and the product in float32, rounded to x's dtype once at the end."""
    return (rms_norm(x, weight, eps) * F.silu(gate.float())).to(x.dtype)


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (Gemma 4's value norm), statistics in float32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 unit_offset: bool = False, scale: torch.Tensor | None = None) -> torch.Tensor:
    """residual + rms_norm(x), times scale if given: a sandwich-norm block's output norm and the residual add after
    it (Gemma), with Gemma 4's per-layer output scale ([1] tensor) on the sum. Each step rounds to x's dtype."""
    out = residual + rms_norm(x, weight, eps, unit_offset)
    return out if scale is None else out * scale


def rms_norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                          eps: float, unit_offset: bool = False,
                          scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h, next_weight), h) for h = rms_norm_add(x, residual, weight, eps, unit_offset, scale): a sandwich
    block's output norm and residual add, then the next block's input norm, in one op."""
    h = rms_norm_add(x, residual, weight, eps, unit_offset, scale)
    return rms_norm(h, next_weight, eps, unit_offset), h


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm block's residual add and the next norm in one op."""
    h = x + residual
    return rms_norm(h, weight, eps, unit_offset), h
