"""Qwen3 (dense): Llama body with per-head RMSNorm on q and k before rotary, no q/k/v bias."""
from __future__ import annotations

from ember.layers.decoder import DecoderArgs, DecoderForCausalLM, qwen_sliding_windows


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def args_from_hf(cls, cfg: dict) -> DecoderArgs:
        bias = cfg.get("attention_bias", False)
        return DecoderArgs.from_hf(
            cfg, qk_norm=True, qkv_bias=bias, o_bias=bias, sliding_windows=qwen_sliding_windows(cfg)
        )
