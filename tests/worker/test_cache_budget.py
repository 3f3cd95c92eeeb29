"""The KV budget on a GPU, with the device's memory queries stood in for on CPU."""
from types import SimpleNamespace

import pytest
import torch

from ember.config import CacheConfig
from ember.worker.model_runner import CUDA_ACTIVATION_RESERVE, ModelRunner

GiB = 2**30


class Runner(ModelRunner):
    kv_bytes_per_token = 4096
    state_bytes = 0
    sliding_bytes = 0

    def __init__(self) -> None:  # only what sizing the pool reads
        self.cache_cfg = CacheConfig()
        self.device = torch.device("cuda", 0)
        self.block_size = 16


@pytest.fixture
def gpu(monkeypatch):
    mem = SimpleNamespace(free=10 * GiB, reserved=0, allocated=0, total=141 * GiB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (mem.free, mem.total))

    def empty_cache():  # the cache's unused segments go back to the driver
        mem.free += mem.reserved - mem.allocated
        mem.reserved = mem.allocated

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    props = SimpleNamespace(total_memory=mem.total)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return mem


def test_memory_the_caching_allocator_holds_unused_counts_as_free(gpu):
    """An engine dropped earlier in the process leaves its pool in torch's cache; the driver counts it as used
    until the cache hands it back."""
    runner = Runner()
    alone = runner._size_pool(runner._cache_budget())
    assert alone == int((10 * GiB * 0.9 - CUDA_ACTIVATION_RESERVE) // (4096 * 16))
    gpu.free, gpu.reserved, gpu.allocated = 2 * GiB, 9 * GiB, 1 * GiB  # 8 GiB cached, unused
    assert runner._size_pool(runner._cache_budget()) == alone


def test_no_room_for_a_cache_names_the_memory(gpu):
    gpu.free, gpu.reserved, gpu.allocated = 2 * GiB, 1 * GiB, 1 * GiB
    with pytest.raises(ValueError, match=r"no room for a KV cache on cuda:0: 2.00 of its 141.00 GiB are free.*"
                                         r"gpu_memory_utilization=0.9.*kv_cache_gb"):
        runner = Runner()
        runner._size_pool(runner._cache_budget())
    runner = Runner()
    runner.cache_cfg.kv_cache_gb = 1.0  # an explicit size is taken as given
    assert runner._size_pool(runner._cache_budget()) == GiB // (4096 * 16)
