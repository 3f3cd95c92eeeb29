"""Reference projections: y = x W^T + b, and the two fusions a decode step wants around it: the down projection
of a gated MLP fed its fused gate/up projection (the activation applied on the way in), and a projection fed
the RMSNorm of its input (with the residual add before the norm). On CUDA, ember.ops.triton replaces them for
one-row inputs."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.ops.activation import gated
from ember.ops.norm import add_rms_norm, rms_norm


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def gated_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act: str = "silu") -> torch.Tensor:
    """linear(act(gate) * up, W, b) for a fused [..., 2 * I] gate/up input."""
    return F.linear(gated(gate_up, act), weight, bias)


def gated_linear_parts(gate_up: torch.Tensor, weight: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """gated_linear (no bias) for a caller that only adds the result to the residual stream and normalises it
    (add_rms_norm, rms_norm_linear). A kernel may return float32 split-K partial products [S, ..., N] instead of
    the [..., N] output; those two ops sum them. The reference returns gated_linear's output."""
    return gated_linear(gate_up, weight, None, act)


def rms_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, bias: torch.Tensor | None = None,
                    weight_offset: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(x + residual), W, b), x + residual); without a residual, x is the residual stream."""
    if residual is None:
        h, residual = rms_norm(x, norm_weight, eps, weight_offset), x
    else:
        h, residual = add_rms_norm(x, residual, norm_weight, eps, weight_offset)
    return F.linear(h, weight, bias), residual
