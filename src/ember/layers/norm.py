"""RMSNorm; weight_offset picks the family's rounding (ember.ops.norm): None for Llama/Qwen (the normalised value
cast back before the weight), 1.0 for weights stored as (scale - 1), 0.0 for Gemma 4 (the weight in float32)."""
from __future__ import annotations

import torch
from torch import nn

from ember import ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, weight_offset: float | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x); with a residual, (norm(x + residual), x + residual) in one fused op."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps, self.weight_offset)
        return ops.add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)
