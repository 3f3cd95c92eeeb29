"""Tensor parallelism over the devices of one host with torch.distributed (NCCL on GPUs, gloo on CPU).

One process per device. The process's TP group is a per-process fact set once at start-up (like the
default process group itself); layers read it when they are built, so model files need no TP plumbing.
Column-parallel layers split output features, row-parallel layers split input features and all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class TPGroup:
    rank: int = 0
    size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's value (ranks must agree on sizes such as the KV pool's)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def shard(self, total: int) -> tuple[int, int]:
        """(start, size) of this rank's equal share of `total` (which must divide evenly)."""
        if total % self.size:
            raise ValueError(f"a dimension of {total} cannot be split evenly over tensor_parallel_size={self.size}")
        size = total // self.size
        return self.rank * size, size


_TP = TPGroup()


def get_tp() -> TPGroup:
    return _TP


def init_tp(rank: int, size: int, init_method: str, backend: str) -> TPGroup:
    """Joins this process to the TP group; called once per process before the model is built."""
    global _TP
    if size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    _TP = TPGroup(rank, size)
    return _TP


def kv_head_shard(num_kv_heads: int, tp: TPGroup) -> tuple[int, int]:
    """(first kv head, kv heads) held by this rank; KV heads are replicated when there are fewer than ranks."""
    if num_kv_heads >= tp.size:
        return tp.shard(num_kv_heads)
    if tp.size % num_kv_heads:
        raise ValueError(f"num_key_value_heads={num_kv_heads} must divide tensor_parallel_size={tp.size}")
    return tp.rank * num_kv_heads // tp.size, 1


def shutdown_tp() -> None:
    """Leaves the TP group; models built afterwards in this process are unsharded again."""
    global _TP
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP = TPGroup()
