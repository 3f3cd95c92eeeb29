"""Reference gated activations over a fused [..., 2 * I] gate/up projection: act(gate) * up; and the elementwise
gates of a Gated DeltaNet layer (softplus log decay, sigmoid write strength)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


def get_activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2 * I] -> [..., I]"""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def act_mul(gate: torch.Tensor, up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """act(gate) * up for gate and up tensors of one shape (Gemma 4's per-layer input gate; gated() over a fused
    gate/up), rounded to the input dtype after the activation and the product."""
    return get_activation(act)(gate) * up


def gated(gate_up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """act(gate) * up, [..., 2 * I] -> [..., I], rounded to the input dtype after the activation and the product."""
    gate, up = gate_up.chunk(2, dim=-1)
    return act_mul(gate, up, act)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gated DeltaNet layer's per-head gates from its projections a, b [T, Hv] (A_log, dt_bias: [Hv]), as
    transformers' Qwen3.5 computes them: (g, beta) with g = -exp(A_log) * softplus(a + dt_bias) the log decay
    (float32, <= 0) and beta = sigmoid(b) the write strength (in b's dtype)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
