"""Checkpoint-name routing shared by model files: HF tensor names onto (possibly fused) ember parameters."""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from ember.layers.linear import default_weight_loader

# HF sub-module name -> (fused ember sub-module, shard id)
Packed = dict[str, tuple[str, object]]


def load_packed_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], packed: Packed,
                        rename: Callable[[str], str | None] = lambda n: n) -> set[str]:
    """Copies each tensor into its parameter through the owning module's weight_loader; returns the filled
    "param:shard" keys. rename maps a checkpoint name to ember's naming, or None to skip the tensor."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    loaded: set[str] = set()
    for hf_name, tensor in weights:
        name = rename(hf_name)
        if name is None:
            continue
        target, shard = name, None
        for hf_part, (fused, shard_id) in packed.items():
            if f".{hf_part}." in name:
                target, shard = name.replace(f".{hf_part}.", f".{fused}."), shard_id
                break
        if target not in params:
            raise ValueError(f"checkpoint tensor {hf_name!r} does not match any parameter of {type(model).__name__}")
        module = modules[target.rsplit(".", 1)[0]]
        loader = getattr(module, "weight_loader", default_weight_loader)
        loader(params[target], tensor, shard, name=hf_name)
        loaded.add(f"{target}:{shard}")
    return loaded
