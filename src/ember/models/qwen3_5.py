"""Qwen3.5 (dense, text): Gated DeltaNet linear-attention layers interleaved with gated full attention, as
transformers' Qwen3_5ForCausalLM. Also loads the multimodal checkpoints' language model (vision tower and MTP
head are skipped). Text-only positions make the interleaved M-RoPE an ordinary partial rotary embedding.

MoE (qwen3_5_moe) would need: a routed-experts block (softmax top-k, renormalised) plus a sigmoid-gated shared
expert in place of the MLP, with fused expert weights [E, 2I, H] / [E, H, I]; the attention and state are as here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from ember.kv.spec import FullAttentionSpec, LayerCacheSpec
from ember.layers.decoder import GatedMLP
from ember.layers.embedding import lm_logits
from ember.layers.gated_attention import GatedAttention
from ember.layers.gated_delta import GatedDeltaArgs, GatedDeltaNet
from ember.layers.linear import Linear
from ember.layers.loading import load_packed_weights
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RopeParams, RotaryEmbedding
from ember.worker.attn_metadata import AttentionMetadata

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(slots=True)
class Qwen3_5Args:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeParams
    layer_types: list[str]
    delta: GatedDeltaArgs
    hidden_act: str = "silu"
    attention_bias: bool = False
    tie_word_embeddings: bool = False

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)


def layer_types_from_hf(cfg: dict) -> list[str]:
    num_layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        interval = cfg.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)]
    legacy = {"attention": "full_attention", "mamba": "linear_attention"}  # transformers' legacy names
    types = [legacy.get(t, t) for t in types][:num_layers]
    bad = sorted(set(types) - set(LAYER_TYPES))
    if bad or len(types) != num_layers:
        raise ValueError(f"layer_types {bad or types} not supported; each of {num_layers} layers must be one of "
                         f"{list(LAYER_TYPES)}")
    return types


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(self, a: Qwen3_5Args, rotary: RotaryEmbedding, layer_idx: int) -> None:
        super().__init__()
        self.is_linear = a.layer_types[layer_idx] == "linear_attention"
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(a.delta)
        else:
            self.self_attn = GatedAttention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                                            rotary, a.rms_norm_eps, a.attention_bias)
        self.mlp = GatedMLP(a.hidden_size, a.intermediate_size, a.hidden_act)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, weight_offset=1.0)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, weight_offset=1.0)

    @property
    def mixer(self) -> nn.Module:
        return self.linear_attn if self.is_linear else self.self_attn

    def forward(self, positions: torch.Tensor, h: torch.Tensor, meta: AttentionMetadata,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """rows: the last layer of a step that samples from these rows alone (out_rows in ember/layers/decoder.py)."""
        x = self.input_layernorm(h)
        h = h + (self.linear_attn(x, meta) if self.is_linear else self.self_attn(positions, x, meta))
        if rows is not None:
            h = h[rows]
            if not len(rows):
                return h  # nothing to sample: the layer only had to write its KV or state
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3_5Model(nn.Module):
    def __init__(self, a: Qwen3_5Args) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(a.head_dim, a.max_position_embeddings, a.rope)
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(Qwen3_5DecoderLayer(a, self.rotary, i) for i in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps, weight_offset=1.0)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                out_rows: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(positions, h, meta, out_rows if i == last else None)
        return self.norm(h) if len(h) else h


PACKED = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    "in_proj_qkv": ("in_proj", "qkv"), "in_proj_z": ("in_proj", "z"),
}


class Qwen3_5ForCausalLM(nn.Module):
    def __init__(self, args: Qwen3_5Args) -> None:
        super().__init__()
        self.args = args
        self.model = Qwen3_5Model(args)
        self.lm_head = None if args.tie_word_embeddings else Linear(args.hidden_size, args.vocab_size)

    @classmethod
    def args_from_hf(cls, cfg: dict) -> Qwen3_5Args:
        """Missing keys take transformers' Qwen3_5TextConfig defaults."""
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        max_pos = cfg.get("max_position_embeddings", 32768)
        rope_cfg = dict(cfg)
        rope_params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        if "partial_rotary_factor" not in rope_params and "partial_rotary_factor" not in cfg:
            rope_params["partial_rotary_factor"] = 0.25  # transformers' default for this family
        rope_cfg["rope_parameters"] = rope_params
        eps = cfg.get("rms_norm_eps", 1e-6)
        delta = GatedDeltaArgs(
            hidden_size=hidden, num_k_heads=cfg.get("linear_num_key_heads", 16),
            num_v_heads=cfg.get("linear_num_value_heads", 32), head_k_dim=cfg.get("linear_key_head_dim", 128),
            head_v_dim=cfg.get("linear_value_head_dim", 128), conv_kernel=cfg.get("linear_conv_kernel_dim", 4), eps=eps,
        )
        return Qwen3_5Args(
            vocab_size=cfg["vocab_size"], hidden_size=hidden, intermediate_size=cfg["intermediate_size"],
            num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads", 4),
            head_dim=cfg.get("head_dim", 256), max_position_embeddings=max_pos, rms_norm_eps=eps,
            rope=RopeParams.from_hf(rope_cfg, max_pos), layer_types=layer_types_from_hf(cfg), delta=delta,
            hidden_act=cfg.get("hidden_act", "silu"), attention_bias=cfg.get("attention_bias", False),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                out_rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, meta, out_rows)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return lm_logits(hidden, weight, out)

    def cache_specs(self) -> list[LayerCacheSpec]:
        a = self.args
        return [layer.linear_attn.cache_spec() if layer.is_linear
                else FullAttentionSpec(a.num_key_value_heads, a.head_dim) for layer in self.model.layers]

    def attention_layers(self) -> list[nn.Module]:
        """The cache-owning module of each layer, in cache_specs order."""
        return [layer.mixer for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rename(name: str) -> str | None:
            if name.startswith(("mtp.", "model.visual.")) or "rotary_emb.inv_freq" in name:
                return None
            if name == "lm_head.weight" and self.lm_head is None:
                return None
            return name.replace("model.language_model.", "model.", 1)

        return load_packed_weights(self, weights, PACKED, rename)
