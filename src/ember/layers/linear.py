"""Linear layers whose weight loaders fuse HF q/k/v and gate/up tensors at load time and, under tensor
parallelism, read only this rank's slice (column-parallel: output rows; row-parallel: input columns)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ember import ops
from ember.parallel import get_tp


def materialize(loaded) -> torch.Tensor:
    """A checkpoint tensor, or a lazy slice of one (weights/loader.py) read in full."""
    return loaded if isinstance(loaded, torch.Tensor) else loaded.full()


def _check_shape(expected: tuple, loaded, name: str) -> None:
    if tuple(expected) != tuple(loaded.shape):
        raise ValueError(f"weight {name!r} has shape {tuple(loaded.shape)} but the model config expects {tuple(expected)}")


def default_weight_loader(param: nn.Parameter, loaded, shard_id=None, name: str = "") -> None:
    _check_shape(tuple(param.shape), loaded, name)
    param.data.copy_(materialize(loaded))


def load_slice(target: torch.Tensor, loaded, dim: int, start: int, name: str, full_shape: tuple) -> None:
    """Checks the checkpoint tensor's full shape, then copies rows/cols [start, start + target.shape[dim])."""
    _check_shape(full_shape, loaded, name)
    target.copy_(materialize(loaded.narrow(dim, start, target.shape[dim])))


class Linear(nn.Module):
    """y = x W^T + b with global sizes; parallel="column" splits out_features, "row" splits in_features and
    all-reduces the partial products (the bias is added once, after the reduce)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, parallel: str | None = None) -> None:
        super().__init__()
        self.tp = get_tp() if parallel else None
        self.parallel = parallel if self.tp and self.tp.size > 1 else None
        self.in_features, self.out_features = in_features, out_features
        local_in = self.tp.shard(in_features)[1] if self.parallel == "row" else in_features
        local_out = self.tp.shard(out_features)[1] if self.parallel == "column" else out_features
        self.weight = nn.Parameter(torch.empty(local_out, local_in))
        self.bias = nn.Parameter(torch.empty(local_out)) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None, name: str = "") -> None:
        if self.parallel is None:
            return default_weight_loader(param, loaded, name=name)
        is_bias = param.dim() == 1
        full = (self.out_features,) if is_bias else (self.out_features, self.in_features)
        if self.parallel == "row" and is_bias:
            return default_weight_loader(param, loaded, name=name)
        dim = 1 if self.parallel == "row" else 0
        start = self.tp.shard(self.in_features if dim == 1 else self.out_features)[0]
        load_slice(param.data, loaded, dim, start, name, full)

    def forward(self, x: torch.Tensor, act: str | None = None) -> torch.Tensor:
        """act: x is a fused [..., 2 * in_features] gate/up projection and act(gate) * up is this layer's input
        (a gated MLP's down projection, fused with its activation where a kernel does that)."""
        bias = self.bias if self.parallel != "row" else None
        out = ops.linear(x, self.weight, bias) if act is None else ops.gated_linear(x, self.weight, bias, act)
        if self.parallel != "row":
            return out
        out = self.tp.all_reduce(out)
        return out if self.bias is None else out + self.bias

    def forward_into_norm(self, x: torch.Tensor, act: str) -> torch.Tensor:
        """self(x, act) for a caller that only adds the result to the residual stream and normalises it (the next
        block's forward_normed, or the final RMSNorm): on CUDA at decode batch sizes, float32 split-K partial
        products that those ops sum (ops.gated_linear_parts)."""
        if self.parallel == "row" or self.bias is not None:
            return self(x, act)
        return ops.gated_linear_parts(x, self.weight, act)

    def forward_add(self, x: torch.Tensor, stream: torch.Tensor, act: str | None = None) -> torch.Tensor:
        """stream += self(x, act), in place (on CUDA the GEMM accumulates into the stream: no add of its own).
        Unsharded projections without a bias only."""
        assert self.bias is None and self.parallel is None, "only an unsharded projection without a bias adds in place"
        if act is None:
            return ops.linear_add(x, self.weight, stream)
        return ops.gated_linear_add(x, self.weight, stream, act)

    def forward_normed(self, x: torch.Tensor, residual: torch.Tensor | None,
                       norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual): a pre-norm block's residual add, its RMSNorm (layers/norm.py)
        and this projection, fused where a kernel does that. Without a residual, x is the residual stream."""
        assert self.parallel != "row", "a normed input is replicated: only column-parallel projections take one"
        return ops.rms_norm_linear(x, residual, norm.weight, norm.eps, self.weight, self.bias, norm.weight_offset)


class MergedLinear(Linear):
    """Several column-parallel projections of one input stacked on the output dim (q/k/v, gate/up).

    shard_sizes: global output size of each part. slices: this rank's (start, size) rows of each part's
    checkpoint tensor (default: an equal share; KV heads replicated over ranks pass their own)."""

    def __init__(self, in_features: int, shard_sizes: dict, bias: bool = False, slices: dict | None = None) -> None:
        tp = get_tp()
        self.full_sizes = dict(shard_sizes)
        self.slices = slices or {k: tp.shard(v) for k, v in shard_sizes.items()}
        self.shard_offsets: dict = {}
        offset = 0
        for shard_id, (_, size) in self.slices.items():
            self.shard_offsets[shard_id] = (offset, size)
            offset += size
        super().__init__(in_features, offset, bias)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None, name: str = "") -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded, name=name)
        offset, size = self.shard_offsets[shard_id]
        start = self.slices[shard_id][0]
        full = (self.full_sizes[shard_id],) + tuple(param.shape[1:])
        load_slice(param.data.narrow(0, offset, size), loaded, 0, start, name, full)


WeightLoader = Callable[..., None]
