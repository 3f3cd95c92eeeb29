"""Full attention with a sigmoid output gate (Qwen3-Next / Qwen3.5): q_proj yields [q | gate] per head, q and k
get a (1 + w) per-head RMSNorm, rotary may cover a fraction of each head, and the attention output is scaled by
sigmoid(gate) before o_proj."""
from __future__ import annotations

import torch
from torch import nn

from ember import ops
from ember.layers.linear import Linear, MergedLinear
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.worker.attn_metadata import AttentionMetadata


class GatedAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, rotary: RotaryEmbedding,
                 eps: float, bias: bool = False) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads={num_heads} must be a multiple of num_key_value_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = MergedLinear(hidden_size, {"q": 2 * self.q_size, "k": self.kv_size, "v": self.kv_size}, bias)
        self.o_proj = Linear(self.q_size, hidden_size, bias)
        self.q_norm = RMSNorm(head_dim, eps, weight_offset=1.0)
        self.k_norm = RMSNorm(head_dim, eps, weight_offset=1.0)
        self.rotary = rotary
        self.scale = head_dim**-0.5
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner
        self.kv_group = 0  # the KV group (block table) of this layer's cache, bound with it

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        meta = meta.for_group(self.kv_group)
        q_gate, k, v = self.qkv_proj(x).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q.contiguous())
        k = self.k_norm(k.reshape(num_tokens, self.num_kv_heads, self.head_dim))
        q, k = ops.apply_rotary(positions, q, k, self.rotary.cos_sin(x.device), self.rotary.rot_dim)
        assert self.kv_cache is not None, "KV cache not bound: the model runner binds it before the first step"
        ops.write_kv(self.kv_cache, k, v.reshape(num_tokens, self.num_kv_heads, self.head_dim), meta.slot_mapping)
        out = ops.paged_attention(q, self.kv_cache, meta, self.scale)
        out = out.reshape(num_tokens, self.q_size) * torch.sigmoid(gate.reshape(num_tokens, self.q_size))
        return self.o_proj(out)
