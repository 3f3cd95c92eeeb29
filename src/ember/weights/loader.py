"""Load safetensors checkpoints (single or sharded) lazily, straight to the target device and dtype."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from ember.config import ModelConfig
from ember.layers.linear import MergedLinear
from ember.models.registry import get_model_class, model_args
from ember.parallel import get_tp


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {index.name} are missing: {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {str(model_dir)!r}")
    return files


class LazySlice:
    """A checkpoint tensor not yet read: tensor-parallel ranks read only their slice of it."""

    def __init__(self, handle_slice, dtype: torch.dtype) -> None:
        self._slice, self._dtype = handle_slice, dtype
        self.shape = tuple(handle_slice.get_shape())

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self._dtype) if t.is_floating_point() else t

    def narrow(self, dim: int, start: int, size: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + size)
        return self._cast(self._slice[tuple(index)])

    def full(self) -> torch.Tensor:
        return self._cast(self._slice[:])


def iterate_weights(files: list[Path], dtype: torch.dtype, device: torch.device, progress: bool = True,
                    lazy: bool = False) -> Iterator[tuple[str, torch.Tensor | LazySlice]]:
    """Yields (name, tensor) one at a time from memory-mapped files, read onto `device` and cast to dtype;
    with lazy=True, yields LazySlice handles so a loader reads only the part it keeps."""
    where = str(device) if device.type == "cuda" else "cpu"
    names = []
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            names += [(f, k) for k in handle.keys()]
    bar = tqdm(total=len(names), desc="Loading weights", unit="tensor", disable=not progress, leave=False)
    for f in files:
        with safe_open(str(f), framework="pt", device=where) as handle:
            for name in handle.keys():
                if lazy:
                    yield name, LazySlice(handle.get_slice(name), dtype)
                else:
                    t = handle.get_tensor(name)
                    yield name, (t.to(dtype) if t.is_floating_point() else t)
                bar.update(1)
    bar.close()


def expected_weight_keys(model: nn.Module) -> set[str]:
    keys = set()
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            shards = list(module.shard_offsets) if isinstance(module, MergedLinear) else [None]
            keys.update(f"{full}:{s}" for s in shards)
    return keys


def _dummy_init(model: nn.Module, seed: int) -> None:
    for i, (name, p) in enumerate(model.named_parameters()):
        gen = torch.Generator(device=p.device).manual_seed(seed * 100_003 + i)
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        else:  # small std keeps activations finite through deep stacks of random layers
            p.data.normal_(0.0, 0.02, generator=gen)


def load_model(cfg: ModelConfig, progress: bool = True) -> nn.Module:
    """Builds the architecture on the meta device, materialises it on cfg.device and fills it."""
    cls = get_model_class(cfg.model_type)
    args = model_args(cls, cfg.hf_config)
    with torch.device("meta"):
        model = cls(args)
    model = model.to_empty(device=cfg.device).to(cfg.dtype)
    if cfg.load_format == "dummy":
        _dummy_init(model, cfg.seed)
        return model.eval()
    files = checkpoint_files(Path(cfg.model))
    loaded = model.load_weights(iterate_weights(files, cfg.dtype, cfg.device, progress, lazy=get_tp().size > 1))
    missing = sorted(expected_weight_keys(model) - loaded)
    if missing:
        raise ValueError(f"checkpoint {cfg.model!r} lacks weights for: {', '.join(k.split(':')[0] for k in missing[:8])}"
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    return model.eval()
