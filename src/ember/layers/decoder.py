"""A pre-norm decoder-only transformer (Llama family): the shared body of llama, mistral, qwen2 and qwen3.

Model files map their HF config onto DecoderArgs; HF parameter names are kept so checkpoints load by name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from ember.kv.spec import FullAttentionSpec, LayerCacheSpec, SlidingWindowSpec
from ember.layers.attention import Attention
from ember.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from ember.layers.linear import Linear, MergedLinear
from ember.layers.loading import load_packed_weights
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RopeParams, RotaryEmbedding
from ember.parallel import get_tp, kv_head_shard
from ember.worker.attn_metadata import AttentionMetadata

# EMBER_ADD_IN_PLACE_MIN_ROWS=N (default 512): steps of more than N tokens (prefill chunks) add the o and down
# projections into the residual stream in place: on CUDA cuBLAS reads the stream in the GEMM's epilogue (beta = 1),
# and the next RMSNorm kernel reads one tensor instead of the projection and the stream and writes one instead of
# two (~0.5 GB less traffic per norm at a 32k-token step of qwen3-8b). On an H100 that made the 32k-token step
# 4-8 ms shorter (685-689 against 693 ms) and 8k-token prefill 1% faster (NOTES v30). Decode-sized steps keep the
# split-K down projection summed in the norm kernel: there cuBLAS's beta = 1 kernels were slower (NOTES v29).
ADD_IN_PLACE_MIN_ROWS = int(os.environ.get("EMBER_ADD_IN_PLACE_MIN_ROWS", 512))

# out_rows (every model's forward): a step samples from a few rows of its final hidden states (each sequence's
# last token; none in a chunk before a prompt's last), but every token's K and V must be written. So the forward
# takes the rows the step samples from, and the last layer selects them after its attention: its MLP (~80% of a
# qwen3-8b layer's weights) and the final norm run on those rows alone, as in llama.cpp. At a 32k-token prefill
# step that is ~2% of the step's FLOPs. Steps with prompt logprobs need every row and pass none.


@dataclass(slots=True)
class DecoderArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeParams
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # per-layer sliding window (None = full attention)
    sliding_windows: list[int | None] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict, **overrides) -> "DecoderArgs":
        """The Llama config keys, which every Llama-family config.json uses with the same meaning."""
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        max_pos = cfg.get("max_position_embeddings", 4096)
        args = dict(
            vocab_size=cfg["vocab_size"], hidden_size=hidden, intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads, max_position_embeddings=max_pos,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope=RopeParams.from_hf(cfg, max_pos),
            hidden_act=cfg.get("hidden_act", "silu"), tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        )
        args.update(overrides)
        return cls(**args)


def qwen_sliding_windows(cfg: dict) -> list[int | None]:
    """Qwen2/Qwen3 per-layer windows: layer_types, else use_sliding_window + max_window_layers."""
    num_layers = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    if not window:
        return [None] * num_layers
    layer_types = cfg.get("layer_types")
    if layer_types:
        return [window if t == "sliding_attention" else None for t in layer_types]
    max_window_layers = cfg.get("max_window_layers", num_layers)
    return [window if i >= max_window_layers else None for i in range(num_layers)]


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, {0: intermediate, 1: intermediate}, bias)
        self.down_proj = Linear(intermediate, hidden, bias, parallel="row")
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), act=self.act)


class DecoderLayer(nn.Module):
    def __init__(self, a: DecoderArgs, rotary: RotaryEmbedding, layer_idx: int) -> None:
        super().__init__()
        window = a.sliding_windows[layer_idx] if a.sliding_windows else None
        self.self_attn = Attention(
            a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, rotary,
            qkv_bias=a.qkv_bias, o_bias=a.o_bias, qk_norm_eps=a.rms_norm_eps if a.qk_norm else None,
            sliding_window=window,
        )
        self.mlp = GatedMLP(a.hidden_size, a.intermediate_size, a.hidden_act, a.mlp_bias)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        # o and down are added into the stream by the GEMM only where nothing comes between: no bias, no all-reduce
        self.adds_in_place = not (a.o_bias or a.mlp_bias or get_tp().size > 1)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds the two, so
        each residual add is fused with the norm that follows it (and may sum the MLP output's split-K partials).
        Steps of more than ADD_IN_PLACE_MIN_ROWS tokens instead add the o and down projections into the stream in
        place (in the GEMM on CUDA) and return (the stream, None): the norms then read one tensor, not two.
        rows: the last layer of a step that samples from these rows alone: every token's K and V are written, the
        MLP runs on these rows only (out_rows, above)."""
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = attn.qkv_proj.forward_normed(h, residual, self.input_layernorm)
        in_place = self.adds_in_place and qkv.shape[0] > ADD_IN_PLACE_MIN_ROWS
        h = attn.attend(positions, qkv, meta, stream=residual if in_place else None)
        if rows is not None:
            if not len(rows):
                return h[:0], None  # nothing to sample: the layer only had to write its KV
            h, residual = h[rows], None if in_place else residual[rows]
        if in_place:
            gate_up, _ = mlp.gate_up_proj.forward_normed(h, None, self.post_attention_layernorm)
            return mlp.down_proj.forward_add(gate_up, h, mlp.act), None
        gate_up, residual = mlp.gate_up_proj.forward_normed(h, residual, self.post_attention_layernorm)
        return mlp.down_proj.forward_into_norm(gate_up, mlp.act), residual


class DecoderModel(nn.Module):
    def __init__(self, a: DecoderArgs) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(a.head_dim, a.max_position_embeddings, a.rope)
        self.embed_tokens = VocabParallelEmbedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a, self.rotary, i) for i in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                out_rows: torch.Tensor | None = None) -> torch.Tensor:
        h, residual = self.embed_tokens(input_ids), None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h, residual = layer(positions, h, residual, meta, out_rows if i == last else None)
        if not len(h):
            return h
        return self.norm(h) if residual is None else self.norm(h, residual)[0]


# HF checkpoint name -> (fused parameter name, shard id)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


class DecoderForCausalLM(nn.Module):
    """Base for Llama-family models; subclasses provide `args_from_hf(config: dict) -> DecoderArgs`."""

    supports_tensor_parallel = True  # every projection is a column/row-parallel layer

    def __init__(self, args: DecoderArgs) -> None:
        super().__init__()
        self.args = args
        self.model = DecoderModel(args)
        self.lm_head = None if args.tie_word_embeddings else ParallelLMHead(args.vocab_size, args.hidden_size)

    @classmethod
    def args_from_hf(cls, cfg: dict) -> DecoderArgs:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                out_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The final hidden states of every token, or of out_rows alone ([len(out_rows), hidden]; out_rows, above)."""
        return self.model(input_ids, positions, meta, out_rows)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return (self.model.embed_tokens if self.lm_head is None else self.lm_head).logits(hidden, out)

    def cache_specs(self) -> list[LayerCacheSpec]:
        a = self.args
        kv_heads = kv_head_shard(a.num_key_value_heads, get_tp())[1]  # this rank's share
        return [
            FullAttentionSpec(kv_heads, a.head_dim) if not w else SlidingWindowSpec(kv_heads, a.head_dim, w)
            for w in (a.sliding_windows or [None] * a.num_hidden_layers)
        ]

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copies HF-named tensors into (fused) parameters; returns the filled "param:shard" keys."""
        def rename(name: str) -> str | None:
            skip = "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is None)
            return None if skip else name

        return load_packed_weights(self, weights, PACKED_MODULES, rename)
