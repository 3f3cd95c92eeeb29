"""Tiny configs of the hybrid architectures (sliding/full/shared-KV attention, Gated DeltaNet), written as real
HF model directories by transformers. Norm weights are randomised too, so (1 + w) versus w scaling is tested."""
from __future__ import annotations

from pathlib import Path

import torch

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.3, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)
DELTA = dict(linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=16, linear_num_key_heads=2,
             linear_num_value_heads=4)

# name -> (model_type, overrides)
HYBRID_CONFIGS: dict[str, tuple[str, dict]] = {
    # linear, full, linear, linear, full; partial rotary over a quarter of each head
    "qwen3_5": ("qwen3_5_text", dict(num_hidden_layers=5, head_dim=16, tie_word_embeddings=False, **DELTA,
                                     layer_types=["linear_attention", "full_attention", "linear_attention",
                                                  "linear_attention", "full_attention"])),
    "qwen3_5-tied-mha": ("qwen3_5_text", dict(num_hidden_layers=2, head_dim=16, tie_word_embeddings=True,
                                              **{**DELTA, "linear_num_value_heads": 2, "linear_value_head_dim": 8},
                                              layer_types=["linear_attention", "full_attention"])),
    # sliding (window 20, spans blocks) and global layers with a wider head and proportional RoPE; the last two
    # layers read the KV of layers 3 (sliding) and 2 (global); per-layer inputs; double-wide MLP; soft-capping
    "gemma4": ("gemma4_text", dict(num_hidden_layers=6, head_dim=16, global_head_dim=32, sliding_window=20,
                                   layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                "sliding_attention", "sliding_attention", "full_attention"],
                                   num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                                   vocab_size_per_layer_input=512, use_double_wide_mlp=True,
                                   final_logit_softcapping=30.0, tie_word_embeddings=True)),
    # global layers with K = V and their own KV head count; no PLE, no sharing, untied, no soft-capping
    "gemma4-k-eq-v": ("gemma4_text", dict(num_hidden_layers=4, head_dim=16, global_head_dim=24, sliding_window=12,
                                          attention_k_eq_v=True, num_global_key_value_heads=1,
                                          hidden_size_per_layer_input=0, tie_word_embeddings=False,
                                          layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                                       "full_attention"])),
}

# Real head sizes (the GPU kernels' tiles: Gated DeltaNet heads of 128, attention heads of 128 and 256), HF's init
# (0.02), embeddings and LM head drawn at 0.5 as in the demo models (a less flat next-token distribution), weights
# stored in bf16 so that bf16 and float32 runs share them: bf16 runs of these are held to bf16 tolerance.
BF16_BASE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=128, max_position_embeddings=2048, rms_norm_eps=1e-6, initializer_range=0.02,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
BF16_CONFIGS: dict[str, tuple[str, dict]] = {
    "qwen3_5": ("qwen3_5_text", dict(linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                                     linear_num_key_heads=2, linear_num_value_heads=4, num_hidden_layers=4,
                                     layer_types=["linear_attention"] * 3 + ["full_attention"])),
    # windows of 128 tokens (a 552-token run crosses several), global layers with 256-wide heads, per-layer inputs
    "gemma4": ("gemma4_text", dict(num_hidden_layers=4, global_head_dim=256, sliding_window=128,
                                   layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                   hidden_size_per_layer_input=64, vocab_size_per_layer_input=512,
                                   num_kv_shared_layers=0, tie_word_embeddings=True)),
}


def _random_model(name: str, model_type: str, params: dict):
    """transformers' model of the config, float32, eval, initialised from a seed of its name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(sum(map(ord, name)))
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **params), dtype=torch.float32).eval()


def build_hybrid_model(name: str, out_dir: Path):
    """Writes the model to out_dir and returns the transformers model (float32, eval)."""
    model_type, overrides = HYBRID_CONFIGS[name]
    model = _random_model(name, model_type, {**BASE, **overrides})
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("dt_bias"):
                p.add_(torch.randn_like(p) * 0.3)
        for bname, b in model.named_buffers():
            if bname.endswith("layer_scalar"):  # a learned per-layer output scale, stored as a buffer
                b.uniform_(0.5, 1.5)
    model.save_pretrained(out_dir)
    return model


def build_multimodal_model(name: str, out_dir: Path):
    """The same text config inside the family's image-text wrapper (tiny or no vision tower): checkpoint names
    gain a `model.language_model.` prefix and carry tower weights the text engine must skip."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    model_type, overrides = HYBRID_CONFIGS[name]
    text = {**BASE, **overrides}
    if model_type == "qwen3_5_text":
        cfg = AutoConfig.for_model("qwen3_5", text_config=text, tie_word_embeddings=text["tie_word_embeddings"],
                                   vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                      out_hidden_size=64))
    else:
        cfg = AutoConfig.for_model("gemma4", text_config=text, vision_config=None, audio_config=None)
    torch.manual_seed(1)
    model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32).eval()
    model.save_pretrained(out_dir)
    return model


def build_bf16_model(name: str, out_dir: Path) -> None:
    """Writes BF16_CONFIGS[name] to out_dir in bf16 (see BF16_BASE)."""
    model_type, overrides = BF16_CONFIGS[name]
    model = _random_model(name, model_type, {**BF16_BASE, **overrides})
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("embed_tokens.weight") or pname.startswith("lm_head"):
                p.normal_(0.0, 0.5)
    model.to(torch.bfloat16).save_pretrained(out_dir)
