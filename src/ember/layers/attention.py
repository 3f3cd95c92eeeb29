"""Self-attention over the paged KV pool: fused qkv projection, optional per-head q/k norm, rotary, KV write."""
from __future__ import annotations

import torch
from torch import nn

from ember import ops
from ember.layers.linear import Linear, MergedLinear
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.parallel import get_tp, kv_head_shard
from ember.worker.attn_metadata import AttentionMetadata


class Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding | None,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm_eps: float | None = None,
        sliding_window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads={num_heads} must be a multiple of num_key_value_heads={num_kv_heads}")
        tp = get_tp()
        q_start, local_heads = tp.shard(num_heads)
        kv_start, local_kv_heads = kv_head_shard(num_kv_heads, tp)
        self.num_heads, self.num_kv_heads, self.head_dim = local_heads, local_kv_heads, head_dim
        self.q_size, self.kv_size = local_heads * head_dim, local_kv_heads * head_dim
        kv_slice = (kv_start * head_dim, self.kv_size)
        self.qkv_proj = MergedLinear(
            hidden_size, {"q": num_heads * head_dim, "k": num_kv_heads * head_dim, "v": num_kv_heads * head_dim},
            qkv_bias, slices={"q": (q_start * head_dim, self.q_size), "k": kv_slice, "v": kv_slice},
        )
        self.o_proj = Linear(num_heads * head_dim, hidden_size, o_bias, parallel="row")
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.rotary = rotary
        self.sliding_window = sliding_window
        self.scale = head_dim**-0.5 if scale is None else scale
        self.softcap = softcap
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner
        self.kv_group = 0  # the KV group (block table) of this layer's cache, bound with it

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.attend(positions, self.qkv_proj(x), meta)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, meta: AttentionMetadata,
               stream: torch.Tensor | None = None) -> torch.Tensor:
        """Everything after the qkv projection, for callers that fuse that projection with the norm before it.
        stream: the output projection is added into this residual stream in place (Linear.forward_add), which is
        returned."""
        num_tokens = qkv.shape[0]
        meta = meta.for_group(self.kv_group)
        assert self.kv_cache is not None, "KV cache not bound: the model runner binds it before the first step"
        has_norm, rotary = self.q_norm is not None, self.rotary
        # q/k norm, rotary, the KV write and attention are one op (one or two kernels on CUDA)
        out = ops.qkv_attention(
            qkv, positions, self.kv_cache, meta, self.num_heads, self.num_kv_heads,
            self.q_norm.weight if has_norm else None, self.k_norm.weight if has_norm else None,
            self.q_norm.eps if has_norm else 1e-6,
            rotary.cos_sin(qkv.device) if rotary is not None else None, rotary.rot_dim if rotary is not None else 0,
            self.scale, self.sliding_window, self.softcap,
        )
        out = out.reshape(num_tokens, self.q_size)
        return self.o_proj(out) if stream is None else self.o_proj.forward_add(out, stream)
