"""Reference RMSNorm (Zhang & Sennrich, arXiv:1910.07467), statistics in float32, rounded as each family rounds it.

weight_offset selects how the weight applies, which decides the rounding in bf16/fp16:
- None (Llama, Qwen2/3, Mistral): the normalised value is cast to the input dtype, then the weight multiplies it;
- a number o: (o + weight) multiplies the float32 normalised value, rounded once. o = 1.0 for weights stored as
  (scale - 1) (Qwen3.5, Gemma 1-3), o = 0.0 for Gemma 4, whose norms multiply by the weight in float32."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float | None = None) -> torch.Tensor:
    """x: [..., N] -> [..., N]; weight_offset: see the module docstring."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight_offset is not None:
        return (xf * (weight_offset + weight.float())).to(dtype)
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
                 weight_offset: float | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """residual + rms_norm(x), times scale if given: a sandwich-norm block's output norm and the residual add after
    it (Gemma), with Gemma 4's per-layer output scale ([1] tensor) on the sum. Each step rounds to x's dtype."""
    out = residual + rms_norm(x, weight, eps, weight_offset)
    return out if scale is None else out * scale


def rms_norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                          eps: float, weight_offset: float | None = None,
                          scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h, next_weight), h) for h = rms_norm_add(x, residual, weight, eps, weight_offset, scale): a sandwich
    block's output norm and residual add, then the next block's input norm, in one op."""
    h = rms_norm_add(x, residual, weight, eps, weight_offset, scale)
    return rms_norm(h, next_weight, eps, weight_offset), h


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_offset: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm block's residual add and the next norm in one op."""
    h = x + residual
    return rms_norm(h, weight, eps, weight_offset), h
