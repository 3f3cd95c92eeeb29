"""`ember info`: a model's architecture, size, dtype, layer kinds and KV cost per token."""
from __future__ import annotations

import argparse
import collections
import json

from ember.cli.common import add_model_args, resolve_model


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="print a model's architecture summary")
    add_model_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def model_summary(model_dir: str, dtype: str = "auto", ssm_state_dtype: str = "float32",
                  kv_cache_dtype: str = "auto") -> dict:
    """Built on the meta device: no weights are read, so it is instant for any size."""
    import torch

    from ember.config import ModelConfig
    from ember.config import CacheConfig
    from ember.kv.spec import kv_groups, state_bytes_per_slot, with_recurrent_dtype
    from ember.models.registry import get_model_class, model_args

    cfg = ModelConfig.from_dir(model_dir, dtype, "cpu")
    cls = get_model_class(cfg.model_type)
    with torch.device("meta"):
        model = cls(model_args(cls, cfg.hf_config))
    cache_cfg = CacheConfig(ssm_state_dtype=ssm_state_dtype, kv_cache_dtype=kv_cache_dtype)
    state_dtype, kv_dtype = cache_cfg.state_dtype(cfg.dtype), cache_cfg.kv_dtype(cfg.dtype)
    specs = with_recurrent_dtype(model.cache_specs(), state_dtype)
    kinds = collections.Counter(type(s).__name__.replace("Spec", "") for s in specs)
    groups, block_size = kv_groups(specs), CacheConfig().block_size
    by_kind: collections.Counter = collections.Counter()
    for s in specs:
        by_kind[type(s).__name__.replace("Spec", "")] += s.bytes_per_token(kv_dtype)
    return {
        "model": model_dir, "model_type": cfg.model_type, "architecture": cls.__name__,
        "parameters": sum(p.numel() for p in model.parameters()), "dtype": str(cfg.dtype).removeprefix("torch."),
        "kv_cache_dtype": str(kv_dtype).removeprefix("torch."), "num_layers": len(specs),
        "layer_kinds": dict(kinds), "max_model_len": cfg.max_model_len,
        "vocab_size": cfg.hf_config.get("vocab_size"),
        # what grows with the context: full-attention layers; sliding layers stop at their window
        "kv_bytes_per_token": sum(g.bytes_per_token(specs, kv_dtype) for g in groups if g.window is None),
        "kv_bytes_per_token_by_kind": {k: v for k, v in by_kind.items() if v},
        "sliding_kv_bytes_per_sequence": {
            g.window: g.bytes_per_token(specs, kv_dtype) * (-(-(g.window - 1) // block_size) + 2) * block_size
            for g in groups if g.window is not None},
        "state_bytes_per_sequence": state_bytes_per_slot(specs, cfg.dtype),  # recurrent layers' fixed state
    }


def run(args: argparse.Namespace) -> int:
    info = model_summary(resolve_model(args), args.dtype, args.ssm_state_dtype, args.kv_cache_dtype)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "parameters":
            value = f"{value:,} ({value / 1e9:.2f} B)"
        elif key == "kv_bytes_per_token":
            value = f"{value:,} B ({value / 1024:.1f} KiB per token)"
        elif key == "sliding_kv_bytes_per_sequence" and value:
            value = ", ".join(f"window {w}: at most {b:,} B" for w, b in value.items())
        elif key == "state_bytes_per_sequence" and value:
            value = f"{value:,} B ({value / 2**20:.1f} MiB per running request or prefix snapshot)"
        print(f"{key:<{width}}  {value}")
    return 0
