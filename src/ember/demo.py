"""Built-in demo models: real architectures and configs, deterministic random weights, an offline tokenizer.

`tiny` (the default of every CLI command without a MODEL) is built in a few seconds and cached under the
user cache dir. Larger shapes (`qwen3-0.6b`, `qwen3-8b`, `llama-3-8b`) are written without weights by default
and run with load_format="dummy", which is how benchmarks use real shapes with no download.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from ember.tokenizer.demo import DEMO_VOCAB_SIZE, build_demo_tokenizer

DEMO_VERSION = 2
DEMO_NOTICE = "[ember demo model: random weights, the text below is meaningless]"

_QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
              attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
_LLAMA3 = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
               attention_bias=False, mlp_bias=False,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})

SHAPES: dict[str, dict] = {
    "tiny": {**_QWEN3, "vocab_size": DEMO_VOCAB_SIZE, "hidden_size": 256, "intermediate_size": 768,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "max_position_embeddings": 4096, "tie_word_embeddings": False},
    "tiny-llama": {**_LLAMA3, "vocab_size": DEMO_VOCAB_SIZE, "hidden_size": 256, "intermediate_size": 768,
                   "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False},
    # the ~100M-parameter shape the CPU benchmarks use
    "qwen3-100m": {**_QWEN3, "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
                   "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
                   "max_position_embeddings": 4096, "tie_word_embeddings": True},
    "qwen3-0.6b": {**_QWEN3, "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 40960, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "max_position_embeddings": 40960, "tie_word_embeddings": False},
    "llama-3-8b": {**_LLAMA3, "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 8192, "tie_word_embeddings": False},
    # hybrid families: transformers' default text configs (config-only; run them with load_format="dummy")
    "qwen3_5-default": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
        "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
        "attention_bias": False, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8},
    "gemma4-default": {
        "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 512,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5, "final_logit_softcapping": None,
        "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256, "attention_k_eq_v": False,
        "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
        "per_layer_config": {f"{i:02d}": {"head_dim": 512} for i in (5, 11, 17, 23, 29)}},
}
ARCH_ALIASES = {"qwen3": "tiny", "llama": "tiny-llama"}
WEIGHTS_BY_DEFAULT = {"tiny", "tiny-llama", "qwen3-100m"}


def _random_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """HF-named tensors for the Llama/Qwen3 layout, drawn from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def randn(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    # a larger embedding std makes the random model's next-token distribution less flat
    w = {"model.embed_tokens.weight": randn(cfg["vocab_size"], h, std=0.5), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = randn(cfg["vocab_size"], h, std=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": randn(q, h), p + "self_attn.k_proj.weight": randn(kv, h),
              p + "self_attn.v_proj.weight": randn(kv, h), p + "self_attn.o_proj.weight": randn(h, q),
              p + "mlp.gate_proj.weight": randn(inter, h), p + "mlp.up_proj.weight": randn(inter, h),
              p + "mlp.down_proj.weight": randn(h, inter),
              p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
              p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)}
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
            w[p + "self_attn.k_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
    return w


def make_demo_model(out_dir: str | Path, shape: str = "tiny", with_weights: bool | None = None, seed: int = 0) -> Path:
    """Writes a demo model as a normal HF directory (config, generation config, tokenizer, weights)."""
    shape = ARCH_ALIASES.get(shape, shape)
    if shape not in SHAPES:
        raise ValueError(f"unknown demo shape {shape!r}; choose from {', '.join([*ARCH_ALIASES, *SHAPES])}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**SHAPES[shape], "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": 4, "pad_token_id": 0,
           "ember_demo": {"shape": shape, "seed": seed, "version": DEMO_VERSION}}
    build_demo_tokenizer(out)
    eos = json.loads((out / "tokenizer.json").read_text())
    eos_id = next(t["id"] for t in eos["added_tokens"] if t["content"] == "<|im_end|>")
    cfg["eos_token_id"] = eos_id
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"eos_token_id": eos_id, "pad_token_id": cfg["pad_token_id"], "do_sample": True, "temperature": 0.7,
           "top_p": 0.8, "top_k": 20}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if with_weights if with_weights is not None else shape in WEIGHTS_BY_DEFAULT:
        if cfg["model_type"] not in ("qwen3", "llama"):
            raise ValueError(f"random weights are written for the llama/qwen3 shapes only; run {shape!r} "
                             "config-only with load_format='dummy' (--load-format dummy)")
        save_file(_random_weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def dummy_model_dir(shape: str, tokenizer: bool = False, parent: str | Path | None = None) -> Path:
    """A demo shape's config alone, in a new temporary directory, to run with load_format="dummy": how benchmarks
    measure real shapes. Without its tokenizer unless asked: random weights emit ids far outside the demo
    tokenizer's 4k vocabulary, which incremental detokenization handles pathologically slowly, so benchmarks pass
    and count token ids (as vLLM with detokenize=False). parent: where the directory is made (the temp dir)."""
    out = make_demo_model(tempfile.mkdtemp(prefix=f"ember-{shape}-", dir=parent), shape, with_weights=False)
    if not tokenizer:
        (out / "tokenizer.json").unlink()
    return out


def cache_dir() -> Path:
    base = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ember")
    return Path(base)


def demo_model_dir(shape: str = "tiny") -> Path:
    """The cached demo model, built on first use (atomically, so concurrent first runs are safe)."""
    target = cache_dir() / f"demo-{shape}-v{DEMO_VERSION}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        make_demo_model(tmp, shape)
        os.replace(tmp, target) if not target.exists() else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_demo_model(model_dir: str | Path) -> bool:
    try:
        return "ember_demo" in json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
