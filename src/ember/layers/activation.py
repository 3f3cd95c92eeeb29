"""Gated activations used by the MLP blocks."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ember import ops

_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


def get_activation(name: str):
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def gated_act(gate_up: torch.Tensor, act_name: str = "silu") -> torch.Tensor:
    """act(gate) * up for a fused [..., 2 * intermediate] projection."""
    if act_name == "silu":
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return get_activation(act_name)(gate) * up
