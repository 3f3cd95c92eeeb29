"""Linear layers whose parameters carry a weight loader, so HF q/k/v and gate/up tensors fuse at load time."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _check_shape(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(
            f"weight {name!r} has shape {tuple(loaded.shape)} but the model config expects {tuple(param.shape)}"
        )


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
    _check_shape(param.data, loaded, name)
    param.data.copy_(loaded)


class Linear(nn.Module):
    """y = x W^T + b; `weight_loader` fills a parameter from a checkpoint tensor (shard-aware in subclasses)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
        default_weight_loader(param, loaded, name=name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of one input stacked on the output dim (q/k/v, gate/up); shard ids name the parts."""

    def __init__(self, in_features: int, shard_sizes: dict, bias: bool = False) -> None:
        self.shard_offsets: dict = {}
        offset = 0
        for shard_id, size in shard_sizes.items():
            self.shard_offsets[shard_id] = (offset, size)
            offset += size
        super().__init__(in_features, offset, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, name: str = "") -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded, name=name)
        offset, size = self.shard_offsets[shard_id]
        target = param.data.narrow(0, offset, size)
        _check_shape(target, loaded, name)
        target.copy_(loaded)


WeightLoader = Callable[..., None]
