"""RMSNorm as the Llama/Qwen family computes it (statistics in float32, cast back before the weight)."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        # Gemma-style norms store (weight - 1) and scale by (1 + weight)
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (xf * (1.0 + self.weight.float())).to(dtype)
        return self.weight * xf.to(dtype)
