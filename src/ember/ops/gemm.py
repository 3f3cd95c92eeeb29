"""Reference projections: y = x W^T + b, and the fusions a decode step wants around it: the down projection of a
gated MLP fed its fused gate/up projection (the activation applied on the way in), or act(gate) * up of two
separate inputs; a projection fed the RMSNorm of its input (with the residual add before the norm), or the
residual stream a sandwich norm just added to. On CUDA, ember.ops.triton replaces them for one-row inputs."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.ops.activation import act_mul
from ember.ops.norm import add_rms_norm, rms_norm, rms_norm_add


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def gated_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act: str = "silu") -> torch.Tensor:
    """linear(act(gate) * up, W, b) for a fused [..., 2 * I] gate/up input."""
    return act_mul_linear(*gate_up.chunk(2, dim=-1), weight, bias, act)


def act_mul_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   act: str = "silu") -> torch.Tensor:
    """linear(act(gate) * up, W, b) for gate and up inputs of one shape (Gemma 4's per-layer input gate)."""
    return F.linear(act_mul(gate, up, act), weight, bias)


def linear_add(x: torch.Tensor, weight: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """stream += linear(x, W), in place: a block's output projection and the residual add after it (no bias).
    Returns the stream. The reference rounds the projection, then the sum; a GEMM that reads the stream in its
    epilogue (cuBLAS's beta = 1) rounds once."""
    return stream.add_(F.linear(x, weight))


def gated_linear_add(gate_up: torch.Tensor, weight: torch.Tensor, stream: torch.Tensor,
                     act: str = "silu") -> torch.Tensor:
    """stream += gated_linear(gate_up, W), in place, for a fused [..., 2 * I] gate/up input (no bias)."""
    return stream.add_(gated_linear(gate_up, weight, None, act))


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


def rms_norm_add_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None = None,
                        weight_offset: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(h, W, b), h) for h = residual + rms_norm(x): a sandwich block's output norm and residual add, and a
    projection of the new residual stream (Gemma 4's per-layer input gate)."""
    h = rms_norm_add(x, residual, norm_weight, eps, weight_offset)
    return F.linear(h, weight, bias), h
