"""RMSNorm as the Llama/Qwen family computes it (statistics in float32, cast back before the weight)."""
from __future__ import annotations

import torch
from torch import nn

from ember import ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        # Gemma-style norms store (weight - 1) and scale by (1 + weight)
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x); with a residual, (norm(x + residual), x + residual) in one fused op."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps, self.unit_offset)
        return ops.add_rms_norm(x, residual, self.weight, self.eps, self.unit_offset)
