"""Tiny configs of every supported architecture, written as real HF model directories by transformers."""
from __future__ import annotations

import zlib
from pathlib import Path

import torch

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.3,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)

# name -> (model_type, overrides). Covers GQA ratios, tied embeddings, rope scaling, odd head dims, biases.
CONFIGS: dict[str, tuple[str, dict]] = {
    "llama-gqa": ("llama", {}),
    "llama-mha-tied": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama3-rope": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                                       original_max_position_embeddings=256))),
    "llama-linear-rope-bias": ("llama", dict(attention_bias=True, mlp_bias=True, num_key_value_heads=1,
                                             rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    "qwen2": ("qwen2", dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96, intermediate_size=160)),
    "qwen3": ("qwen3", dict(head_dim=24)),  # head_dim != hidden/heads
    "qwen3-yarn-tied": ("qwen3", dict(tie_word_embeddings=True, head_dim=32,
                                      rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                                           original_max_position_embeddings=256))),
    "mistral-window": ("mistral", dict(sliding_window=24, head_dim=16)),
}


def build_hf_model(name: str, out_dir: Path):
    """Writes the model to out_dir and returns the transformers model (float32, eval)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides = CONFIGS[name]
    cfg = AutoConfig.for_model(model_type, **{**BASE, **overrides})
    torch.manual_seed(zlib.crc32(name.encode()))  # hash(str) differs per process (PYTHONHASHSEED): not this
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.save_pretrained(out_dir)
    return model
