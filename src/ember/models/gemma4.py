"""Gemma 4 (text), as transformers' Gemma4ForCausalLM: sliding-window and global attention layers (global ones with
their own head dim, proportional RoPE and optionally K = V), the last `num_kv_shared_layers` layers reading the KV
of the last earlier layer of their type, per-layer input embeddings (PLE), sandwich norms, a learned per-layer
output scale, attention scale 1 (q/k are RMS-normed), and final logit soft-capping. Also loads the multimodal
checkpoints' language model (vision/audio towers are skipped).

The MoE variant (26B-A4B, enable_moe_block) would add, next to the dense MLP of every layer, a router (unscaled
RMSNorm * scale / sqrt(H), softmax top-k renormalised, per-expert scale) and fused experts [E, 2I, H] / [E, H, I]
with their own pre/post norms; KV, rotary and caching are as here.

Gemma 4's norms multiply by the weight in float32 and round once (weight_offset 0.0 in ember.ops.norm), unlike
Llama's, which round the normalised value before the weight: in bf16 the difference is one rounding per norm.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from ember import ops
from ember.kv.spec import FullAttentionSpec, LayerCacheSpec, SharedKVSpec, SlidingWindowSpec
from ember.layers.decoder import GatedMLP
from ember.layers.embedding import lm_logits
from ember.layers.linear import Linear, MergedLinear
from ember.layers.loading import load_packed_weights
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RopeParams, RotaryEmbedding
from ember.worker.attn_metadata import AttentionMetadata

LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True, slots=True)
class Gemma4LayerArgs:
    layer_type: str
    head_dim: int
    num_kv_heads: int
    intermediate_size: int
    sliding_window: int | None  # None for global layers
    donor: int | None  # KV-shared layers: the layer whose KV they read
    has_v_proj: bool  # global layers with attention_k_eq_v use K as V


@dataclass(slots=True)
class Gemma4Args:
    vocab_size: int
    hidden_size: int
    num_attention_heads: int
    max_position_embeddings: int
    rms_norm_eps: float
    layers: list[Gemma4LayerArgs]
    ropes: dict[str, RopeParams]  # by layer type
    hidden_activation: str = "gelu_pytorch_tanh"
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    final_logit_softcapping: float | None = None
    vocab_size_per_layer_input: int = 0
    hidden_size_per_layer_input: int = 0  # 0: no per-layer input embeddings
    store_layers: list[int] = field(default_factory=list)  # layers whose KV shared layers read

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layers)


def layer_types_from_hf(cfg: dict) -> list[str]:
    num_layers = cfg["num_hidden_layers"]
    types = list(cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                            for i in range(num_layers)])
    if len(types) != num_layers or set(types) - set(LAYER_TYPES):
        raise ValueError(f"layer_types must give one of {list(LAYER_TYPES)} for each of {num_layers} layers")
    types[-1] = "full_attention"  # as transformers forces it
    return types


def per_layer_overrides(cfg: dict, types: list[str]) -> dict[int, dict]:
    """transformers' per_layer_config (saved configs), else the global_head_dim / num_global_key_value_heads keys
    of the original checkpoints, which transformers turns into per_layer_config for the global layers."""
    if cfg.get("per_layer_config") is not None:
        return {int(i): dict(v) for i, v in cfg["per_layer_config"].items()}
    overrides = {"head_dim": cfg.get("global_head_dim", 512)}
    if cfg.get("attention_k_eq_v", False) and cfg.get("num_global_key_value_heads") is not None:
        overrides["num_key_value_heads"] = cfg["num_global_key_value_heads"]
    return {i: dict(overrides) for i, t in enumerate(types) if t == "full_attention"}


def kv_donors(types: list[str], num_shared: int) -> list[int | None]:
    """For each layer, the layer whose KV it reads (None: its own): the last non-shared layer of its type."""
    num_layers = len(types)
    first_shared = num_layers - num_shared
    if num_shared and first_shared <= 0:
        raise ValueError(f"num_kv_shared_layers={num_shared} leaves no layer to produce KV for {num_layers} layers")
    donors: list[int | None] = [None] * num_layers
    for i in range(first_shared, num_layers):
        producers = [j for j in range(first_shared) if types[j] == types[i]]
        if not producers:
            raise ValueError(f"KV-shared layer {i} ({types[i]}) has no earlier {types[i]} layer to read KV from")
        donors[i] = producers[-1]
    return donors


def _rope_for(cfg: dict, layer_type: str, max_pos: int) -> RopeParams:
    rope = cfg.get("rope_parameters") or {}
    default = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                  "rope_theta": 1_000_000.0}}[layer_type]
    return RopeParams.from_hf({"rope_parameters": rope.get(layer_type) or default}, max_pos)


def args_from_hf(cfg: dict) -> Gemma4Args:
    """Missing keys take transformers' Gemma4TextConfig defaults."""
    if cfg.get("use_bidirectional_attention") == "all":
        raise ValueError("Gemma 4 with use_bidirectional_attention='all' is not a causal LM; not supported")
    if cfg.get("enable_moe_block"):
        raise ValueError("Gemma 4 MoE (enable_moe_block) is not supported yet; the dense variants are")
    types = layer_types_from_hf(cfg)
    overrides = per_layer_overrides(cfg, types)
    donors = kv_donors(types, cfg.get("num_kv_shared_layers", 0))
    heads = cfg["num_attention_heads"]
    layers = []
    for i, t in enumerate(types):
        c = {**cfg, **overrides.get(i, {})}
        is_sliding = t == "sliding_attention"
        intermediate = c["intermediate_size"] * (2 if cfg.get("use_double_wide_mlp") and donors[i] is not None else 1)
        layers.append(Gemma4LayerArgs(
            layer_type=t, head_dim=c.get("head_dim", 256), num_kv_heads=c.get("num_key_value_heads", 4),
            intermediate_size=intermediate,
            sliding_window=c.get("sliding_window", 512) if is_sliding else None, donor=donors[i],
            has_v_proj=not (cfg.get("attention_k_eq_v", False) and not is_sliding),
        ))
    max_pos = cfg.get("max_position_embeddings", 131_072)
    return Gemma4Args(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_attention_heads=heads,
        max_position_embeddings=max_pos, rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), layers=layers,
        ropes={t: _rope_for(cfg, t, max_pos) for t in set(types)},
        hidden_activation=cfg.get("hidden_activation", "gelu_pytorch_tanh"),
        tie_word_embeddings=cfg.get("tie_word_embeddings", True), attention_bias=cfg.get("attention_bias", False),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        vocab_size_per_layer_input=cfg.get("vocab_size_per_layer_input", 262_144),
        hidden_size_per_layer_input=cfg.get("hidden_size_per_layer_input", 256) or 0,
        store_layers=sorted({d for d in donors if d is not None}),
    )


NORM = 0.0  # ember.ops.norm's weight_offset for Gemma 4's norms


class ScaledEmbedding(nn.Embedding):
    """Embedding times sqrt(dim), the scale rounded to the weight dtype as transformers does."""

    def __init__(self, num: int, dim: int, scale: float) -> None:
        super().__init__(num, dim)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)
        # a Python float holding the rounded scale: a device scalar would be a host copy (not graph-capturable)
        return out * torch.tensor(self.scale, dtype=out.dtype).item()


class Gemma4Attention(nn.Module):
    def __init__(self, a: Gemma4Args, la: Gemma4LayerArgs, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_attention_heads, la.num_kv_heads, la.head_dim
        self.q_size, self.kv_size = self.num_heads * la.head_dim, la.num_kv_heads * la.head_dim
        self.is_shared, self.has_v_proj = la.donor is not None, la.has_v_proj
        shards = {"q": self.q_size}
        if not self.is_shared:  # shared layers read their donor's KV and have no k/v projections
            shards.update({"k": self.kv_size, **({"v": self.kv_size} if la.has_v_proj else {})})
        self.qkv_proj = MergedLinear(a.hidden_size, shards, a.attention_bias)
        self.o_proj = Linear(self.q_size, a.hidden_size, a.attention_bias)
        self.q_norm = RMSNorm(la.head_dim, a.rms_norm_eps, weight_offset=NORM)
        self.k_norm = None if self.is_shared else RMSNorm(la.head_dim, a.rms_norm_eps, weight_offset=NORM)
        self.eps = a.rms_norm_eps
        self.rotary = rotary
        self.sliding_window = la.sliding_window
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner (the donor's, for shared layers)
        self.kv_group = 0  # the KV group (block table) of this layer's cache, bound with it

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.attend(positions, self.qkv_proj(x), meta)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Everything after the qkv projection: q/k norms, the weightless v norm, rotary and the KV write (one
        kernel on CUDA), attention, the output projection. Shared layers only norm and rotate q."""
        num_tokens = qkv.shape[0]
        meta = meta.for_group(self.kv_group)
        assert self.kv_cache is not None, "KV cache not bound: the model runner binds it before the first step"
        out = ops.qkv_attention(
            qkv, positions, self.kv_cache, meta, self.num_heads, 0 if self.is_shared else self.num_kv_heads,
            self.q_norm.weight, None if self.is_shared else self.k_norm.weight, self.eps,
            self.rotary.cos_sin(qkv.device), self.rotary.rot_dim, 1.0, self.sliding_window,
            v_norm=True, k_as_v=not self.has_v_proj, norm_weight_offset=NORM,
        )
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, a: Gemma4Args, la: Gemma4LayerArgs, rotary: RotaryEmbedding) -> None:
        super().__init__()
        h, eps = a.hidden_size, a.rms_norm_eps
        self.self_attn = Gemma4Attention(a, la, rotary)
        self.mlp = GatedMLP(h, la.intermediate_size, a.hidden_activation)
        self.input_layernorm = RMSNorm(h, eps, weight_offset=NORM)
        self.post_attention_layernorm = RMSNorm(h, eps, weight_offset=NORM)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, weight_offset=NORM)
        self.post_feedforward_layernorm = RMSNorm(h, eps, weight_offset=NORM)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.act = a.hidden_activation
        self.has_ple = bool(a.hidden_size_per_layer_input)
        if self.has_ple:
            self.per_layer_input_gate = Linear(h, a.hidden_size_per_layer_input)
            self.per_layer_projection = Linear(a.hidden_size_per_layer_input, h)
            self.post_per_layer_input_norm = RMSNorm(h, eps, weight_offset=NORM)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata,
                per_layer_input: torch.Tensor | None, next_norm: RMSNorm,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: the residual stream; x: this layer's input norm of it. Returns (h, next_norm(h)), next_norm being the
        next layer's input norm or the final one. Sandwich norms: each block's output is normed and added to the
        residual stream, in one kernel with the next norm where one follows (ops.rms_norm_add_rms_norm); the
        layer's output scale rides on its last add. rows: the last layer of a step that samples from these rows
        alone (out_rows in ember/layers/decoder.py)."""
        attn, mlp, eps = self.self_attn, self.mlp, self.post_attention_layernorm.eps
        out = attn.attend(positions, attn.qkv_proj(x), meta)
        if rows is not None:
            if not len(rows):
                return h[:0], h[:0]  # nothing to sample: the layer only had to write its KV
            out, h = out[rows], h[rows]
            per_layer_input = None if per_layer_input is None else per_layer_input[rows]
        x, h = ops.rms_norm_add_rms_norm(out, h, self.post_attention_layernorm.weight,
                                         self.pre_feedforward_layernorm.weight, eps, NORM)
        out, out_norm = mlp.down_proj(mlp.gate_up_proj(x), act=mlp.act), self.post_feedforward_layernorm
        if self.has_ple:  # per-layer input: act(gate(h)) * this layer's slice of the token's PLE, projected back;
            # the norm + add before the gate and act * PLE after it ride in the two projections' GEMV prologues
            gate, h = ops.rms_norm_add_linear(out, h, out_norm.weight, eps, self.per_layer_input_gate.weight,
                                              weight_offset=NORM)
            out = ops.act_mul_linear(gate, per_layer_input, self.per_layer_projection.weight, act=self.act)
            out_norm = self.post_per_layer_input_norm
        x, h = ops.rms_norm_add_rms_norm(out, h, out_norm.weight, next_norm.weight, eps, NORM, self.layer_scalar)
        return h, x


class Gemma4Model(nn.Module):
    def __init__(self, a: Gemma4Args) -> None:
        super().__init__()
        self.args = a
        rotaries = {}
        for la in a.layers:  # one table per layer type (each type has one head dim)
            rotaries.setdefault(la.layer_type, RotaryEmbedding(la.head_dim, a.max_position_embeddings,
                                                               a.ropes[la.layer_type]))
        self.embed_tokens = ScaledEmbedding(a.vocab_size, a.hidden_size, a.hidden_size**0.5)
        self.layers = nn.ModuleList(Gemma4DecoderLayer(a, la, rotaries[la.layer_type]) for la in a.layers)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps, weight_offset=NORM)
        # the first of the trailing KV-shared layers: from it on no layer writes KV, so a step that samples from a
        # few rows runs those layers on them alone (forward)
        shared = [la.donor is not None for la in a.layers]
        self.shared_from = len(shared) - shared[::-1].index(False) if shared[-1] else None
        self.ple_dim = a.hidden_size_per_layer_input
        if self.ple_dim:
            total = a.num_hidden_layers * self.ple_dim
            self.embed_tokens_per_layer = ScaledEmbedding(a.vocab_size_per_layer_input, total, self.ple_dim**0.5)
            self.per_layer_model_projection = Linear(a.hidden_size, total)
            self.per_layer_projection_norm = RMSNorm(self.ple_dim, a.rms_norm_eps, weight_offset=NORM)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[T, L, P]: (RMSNorm(W embeds / sqrt(H)) + PLE(ids)) / sqrt(2), one slice per layer."""
        shape = (input_ids.shape[0], self.args.num_hidden_layers, self.ple_dim)
        projected = self.per_layer_model_projection(embeds) * self.args.hidden_size**-0.5
        projected = self.per_layer_projection_norm(projected.reshape(shape))
        return (projected + self.embed_tokens_per_layer(input_ids).reshape(shape)) * 2.0**-0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                out_rows: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        per_layer = self.per_layer_inputs(input_ids, h) if self.ple_dim else None
        x = self.layers[0].input_layernorm(h)
        norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        last = len(self.layers) - 1
        for i, (layer, next_norm) in enumerate(zip(self.layers, norms)):
            if i == self.shared_from and out_rows is not None and meta.sample_seq_idx is not None:
                # the KV-shared layers write no KV: only the sampled rows (each sequence's last token) go on, as
                # the queries of a decode step over the KV the layers before wrote: a prompt's tokens skip these
                # layers' work, all but its last (all of them in a chunk before its last).
                if not len(out_rows):
                    return x[:0]
                h, x, positions = h[out_rows], x[out_rows], positions[out_rows]
                per_layer = None if per_layer is None else per_layer[out_rows]
                meta, out_rows = meta.decode_view(out_rows), None
            h, x = layer(positions, h, x, meta, per_layer[:, i] if per_layer is not None else None, next_norm,
                         out_rows if i == last else None)
        return x


PACKED = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
SKIPPED_PREFIXES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


class Gemma4ForCausalLM(nn.Module):
    def __init__(self, args: Gemma4Args) -> None:
        super().__init__()
        self.args = args
        self.model = Gemma4Model(args)
        self.lm_head = None if args.tie_word_embeddings else Linear(args.hidden_size, args.vocab_size)

    @classmethod
    def args_from_hf(cls, cfg: dict) -> Gemma4Args:
        return args_from_hf(cfg)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                out_rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, meta, out_rows)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = lm_logits(hidden, weight, out)
        cap = self.args.final_logit_softcapping
        return logits if not cap else logits.div_(cap).tanh_().mul_(cap)  # tanh(logits / cap) * cap

    def cache_specs(self) -> list[LayerCacheSpec]:
        specs: list[LayerCacheSpec] = []
        for la in self.args.layers:
            if la.donor is not None:
                specs.append(SharedKVSpec(la.donor))
            elif la.sliding_window:
                specs.append(SlidingWindowSpec(la.num_kv_heads, la.head_dim, la.sliding_window))
            else:
                specs.append(FullAttentionSpec(la.num_kv_heads, la.head_dim))
        return specs

    def attention_layers(self) -> list[Gemma4Attention]:
        return [layer.self_attn for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        shared = {i for i, la in enumerate(self.args.layers) if la.donor is not None}

        def rename(name: str) -> str | None:
            name = name.replace("model.language_model.", "model.", 1)
            if name.startswith(SKIPPED_PREFIXES) or "rotary_emb" in name:
                return None
            if name == "lm_head.weight" and self.lm_head is None:
                return None
            parts = name.split(".")
            if len(parts) > 4 and parts[1] == "layers" and int(parts[2]) in shared and parts[4] in (
                    "k_proj", "v_proj", "k_norm", "v_norm"):
                return None  # KV-shared layers ignore their own k/v weights, as transformers does
            return name

        return load_packed_weights(self, weights, PACKED, rename)
