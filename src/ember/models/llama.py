"""Llama 1/2/3 (incl. llama3 rope scaling), as transformers' LlamaForCausalLM."""
from __future__ import annotations

from ember.layers.decoder import DecoderArgs, DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def args_from_hf(cls, cfg: dict) -> DecoderArgs:
        bias = cfg.get("attention_bias", False)
        return DecoderArgs.from_hf(cfg, qkv_bias=bias, o_bias=bias, mlp_bias=cfg.get("mlp_bias", False))
