"""Reference rotary embedding application (RoFormer, arXiv:2104.09864), neox style (rotate-half) over the first
rot_dim channels of each head. cos_sin is the [max_position, 2 * rot_dim] table (cos then sin) of
ember.layers.rotary.RotaryEmbedding."""
from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int) -> torch.Tensor:
    if rot_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, rest = x[..., :rot_dim], x[..., rot_dim:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def apply_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
                 rot_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hk, D], positions: [T] -> rotated (q, k), computed in q's dtype."""
    cos, sin = cos_sin[positions].to(q.dtype).chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return _apply(q, cos, sin, rot_dim), _apply(k, cos, sin, rot_dim)
