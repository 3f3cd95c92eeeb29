"""Reference linear ops: y = x W^T + b, and the down projection of a gated MLP fed its fused gate/up projection
(the activation applied on the way in). On CUDA, ember.ops.triton replaces them for decode-sized inputs."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.ops.activation import gated


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def gated_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act: str = "silu") -> torch.Tensor:
    """linear(act(gate) * up, W, b) for a fused [..., 2 * I] gate/up input."""
    return F.linear(gated(gate_up, act), weight, bias)
