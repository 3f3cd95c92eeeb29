"""Qwen2 / Qwen2.5: Llama body with q/k/v biases and optional per-layer sliding window."""
from __future__ import annotations

from ember.layers.decoder import DecoderArgs, DecoderForCausalLM, qwen_sliding_windows


class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def args_from_hf(cls, cfg: dict) -> DecoderArgs:
        return DecoderArgs.from_hf(cfg, qkv_bias=True, sliding_windows=qwen_sliding_windows(cfg))
