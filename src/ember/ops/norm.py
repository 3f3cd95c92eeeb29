"""Reference RMSNorm (Zhang & Sennrich, arXiv:1910.07467) as the Llama/Qwen family computes it: statistics in
float32, the normalised value cast back to the input dtype before the weight multiplies it."""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """x: [..., N] -> [..., N]; unit_offset: Gemma-style weights stored as (scale - 1)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (xf * (1.0 + weight.float())).to(dtype)
    return weight * xf.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm block's residual add and the next norm in one op."""
    h = x + residual
    return rms_norm(h, weight, eps, unit_offset), h
