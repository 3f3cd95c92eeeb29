"""Tensor-parallel execution: rank 0 (this process) runs the scheduler and its own model shard, and
broadcasts each SchedulerOutput to ranks 1..N-1, one spawned process per device. Every rank runs the same
forward (collectives inside the layers) and the same sampler; rank 0's result is the one used."""
from __future__ import annotations

import dataclasses
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ember.config import CacheConfig, ModelConfig
from ember.models.registry import get_model_class
from ember.parallel import init_tp, shutdown_tp
from ember.worker.model_runner import ModelRunner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_config(model_cfg: ModelConfig, rank: int) -> ModelConfig:
    if model_cfg.device.type != "cuda":
        return model_cfg
    return dataclasses.replace(model_cfg, device=torch.device("cuda", rank))


def _worker_main(rank: int, size: int, init_method: str, backend: str, model_cfg: ModelConfig,
                 cache_cfg: CacheConfig) -> None:
    torch.set_num_threads(1)
    init_tp(rank, size, init_method, backend)
    cfg = _rank_config(model_cfg, rank)
    if cfg.device.type == "cuda":
        torch.cuda.set_device(cfg.device)
    runner = ModelRunner(cfg, cache_cfg, progress=False)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            break
        runner.execute(box[0])
    shutdown_tp()


class TPExecutor:
    def __init__(self, model_cfg: ModelConfig, cache_cfg: CacheConfig, size: int, progress: bool = True) -> None:
        cls = get_model_class(model_cfg.model_type)
        if not getattr(cls, "supports_tensor_parallel", False):
            raise ValueError(f"tensor parallelism is not supported for model_type {model_cfg.model_type!r} yet; "
                             "use tensor_parallel_size=1")
        if model_cfg.device.type == "cuda" and torch.cuda.device_count() < size:
            raise ValueError(f"tensor_parallel_size={size} needs {size} GPUs; {torch.cuda.device_count()} visible")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        backend = "nccl" if model_cfg.device.type == "cuda" else "gloo"
        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=_worker_main, args=(r, size, init_method, backend, model_cfg, cache_cfg),
                                  daemon=True, name=f"ember-tp{r}") for r in range(1, size)]
        for p in self.procs:
            p.start()
        try:
            init_tp(0, size, init_method, backend)
            self.runner = ModelRunner(_rank_config(model_cfg, 0), cache_cfg, progress)
        except BaseException:
            self._kill()
            shutdown_tp()
            raise
        self.is_closed = False

    def __getattr__(self, name: str):  # num_blocks, vocab_size, model, ...: rank 0's runner answers
        return getattr(self.__dict__["runner"], name)

    def execute(self, out):
        dist.broadcast_object_list([out], src=0)
        return self.runner.execute(out)

    def close(self) -> None:
        if self.is_closed:
            return
        self.is_closed = True
        dist.broadcast_object_list([None], src=0)
        for p in self.procs:
            p.join(timeout=10)
        self._kill()
        shutdown_tp()

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
