"""Rotary position embeddings (RoFormer, arXiv:2104.09864) with the scaling variants transformers implements:
default, linear, llama3, yarn (arXiv:2309.00071). Tables are computed as transformers computes them."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ember.ops.rotary import apply_rotary

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


@dataclass(slots=True)
class RopeParams:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    partial_rotary_factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, cfg: dict, max_position_embeddings: int) -> "RopeParams":
        """Reads transformers 5 `rope_parameters` or the older `rope_scaling` + `rope_theta` keys."""
        rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rp.get("rope_type", rp.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}")
        partial = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0
        orig = rp.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
        return cls(
            theta=float(theta), rope_type=rope_type, factor=float(rp.get("factor") or 1.0),
            partial_rotary_factor=float(partial),
            original_max_position_embeddings=orig or max_position_embeddings,
            low_freq_factor=float(rp.get("low_freq_factor", 1.0)), high_freq_factor=float(rp.get("high_freq_factor", 4.0)),
            beta_fast=float(rp.get("beta_fast") or 32), beta_slow=float(rp.get("beta_slow") or 1),
            attention_factor=rp.get("attention_factor"), mscale=rp.get("mscale"),
            mscale_all_dim=rp.get("mscale_all_dim"), truncate=rp.get("truncate", True),
        )


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(p: RopeParams, inv_freq: torch.Tensor) -> torch.Tensor:
    old_len = p.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / p.low_freq_factor, old_len / p.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / p.factor, inv_freq)
    smooth = (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor)
    smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(p: RopeParams, dim: int) -> tuple[torch.Tensor, float]:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.attention_factor
    if attn is None:
        attn = mscale(p.factor, p.mscale) / mscale(p.factor, p.mscale_all_dim) if (p.mscale and p.mscale_all_dim) else mscale(p.factor)

    def corr_dim(rot: float) -> float:
        return (dim * math.log(p.original_max_position_embeddings / (rot * 2 * math.pi))) / (2 * math.log(p.theta))

    low, high = corr_dim(p.beta_fast), corr_dim(p.beta_slow)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = p.theta ** (torch.arange(0, dim, 2).float() / dim)
    extra_factor = 1 - ramp
    inv = (1.0 / (p.factor * pos_freqs)) * (1 - extra_factor) + (1.0 / pos_freqs) * extra_factor
    return inv, float(attn)


def _proportional_inv_freq(p: RopeParams, head_dim: int) -> torch.Tensor:
    # Gemma 4 global layers: the first partial_rotary_factor of the frequencies (exponents over the full head
    # dim) rotate, the rest are 0 (identity), over the whole head
    num_rotated = int(p.partial_rotary_factor * head_dim // 2)
    inv = 1.0 / (p.theta ** (torch.arange(0, 2 * num_rotated, 2, dtype=torch.int64).float() / head_dim))
    return torch.cat([inv, torch.zeros(head_dim // 2 - num_rotated)]) / p.factor


def compute_inv_freq(p: RopeParams, head_dim: int) -> tuple[torch.Tensor, float, int]:
    """Returns (inv_freq [rot_dim/2], attention scaling of cos/sin, rot_dim)."""
    if p.rope_type == "proportional":
        return _proportional_inv_freq(p, head_dim), 1.0, head_dim
    dim = int(head_dim * p.partial_rotary_factor)
    if p.rope_type == "yarn":
        inv, attn = _yarn_inv_freq(p, dim)
        return inv, attn, dim
    inv = _base_inv_freq(p.theta, dim)
    if p.rope_type == "linear":
        inv = inv / p.factor
    elif p.rope_type == "llama3":
        inv = _llama3_inv_freq(p, inv)
    return inv, 1.0, dim


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) rotary embedding over the first rot_dim channels of each head."""

    def __init__(self, head_dim: int, max_position: int, params: RopeParams) -> None:
        super().__init__()
        with torch.device("cpu"):  # models are built on the meta device; the tables are real from the start
            inv_freq, self.attention_scaling, self.rot_dim = compute_inv_freq(params, head_dim)
        self.head_dim = head_dim
        self.max_position = max_position
        self._inv_freq = inv_freq
        # plain attribute, not a buffer: the loader materialises modules from the meta device
        self._cos_sin: torch.Tensor | None = None

    def cos_sin(self, device: torch.device) -> torch.Tensor:
        if self._cos_sin is None or self._cos_sin.device != device:
            t = torch.arange(self.max_position, dtype=torch.float32, device="cpu")[:, None]
            freqs = t @ self._inv_freq[None, :].float()  # [max_pos, rot_dim/2], as transformers: matmul in fp32
            emb = torch.cat((freqs, freqs), dim=-1)
            table = torch.cat([emb.cos(), emb.sin()], dim=-1) * self.attention_scaling
            self._cos_sin = table.to(device)
        return self._cos_sin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [T, Hq, D], k: [T, Hk, D], positions: [T]
        return apply_rotary(positions, q, k, self.cos_sin(q.device), self.rot_dim)
