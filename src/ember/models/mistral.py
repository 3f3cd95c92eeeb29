"""Mistral: Llama body with an optional sliding window on every layer."""
from __future__ import annotations

from ember.layers.decoder import DecoderArgs, DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    @classmethod
    def args_from_hf(cls, cfg: dict) -> DecoderArgs:
        window = cfg.get("sliding_window")
        return DecoderArgs.from_hf(cfg, sliding_windows=[window] * cfg["num_hidden_layers"])
