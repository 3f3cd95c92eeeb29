"""The KV budget on a GPU, with the device's memory queries stood in for on CPU."""
from types import SimpleNamespace

import pytest
import torch

from ember.config import CacheConfig
from ember.worker.model_runner import CUDA_ACTIVATION_RESERVE, FIT_MIN_TOKENS, ModelRunner, activation_reserve

GiB = 2**30


class Runner(ModelRunner):
    kv_bytes_per_token = 4096
    state_bytes = 0
    sliding_bytes = 0

    def __init__(self, hf_config: dict | None = None, max_num_batched_tokens: int = 2048) -> None:
        # only what sizing the pool reads
        self.cache_cfg = CacheConfig(max_num_batched_tokens=max_num_batched_tokens)
        self.model_cfg = SimpleNamespace(hf_config=hf_config or {})
        self.device, self.dtype = torch.device("cuda", 0), torch.bfloat16
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


QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128)


def test_activation_reserve_grows_with_the_token_budget():
    # per token: residual, normed input and two more hidden-sized rows, gate/up + activation, qkv rows (bf16)
    per_token = (4 * 4096 + 3 * 12288 + 48 * 128) * 2
    assert activation_reserve(QWEN3_8B, 8192, 2) == CUDA_ACTIVATION_RESERVE  # below the floor
    assert activation_reserve(QWEN3_8B, 32768, 2) == int(1.5 * per_token * 32768)
    moe = dict(QWEN3_8B, intermediate_size=0, moe_intermediate_size=1536, num_experts_per_tok=8)
    assert activation_reserve(moe, 32768, 2) == activation_reserve(QWEN3_8B, 32768, 2)


def test_a_bigger_token_budget_leaves_a_smaller_pool(gpu):
    gpu.free = 100 * GiB
    small, big = Runner(QWEN3_8B, 8192), Runner(QWEN3_8B, 32768)
    per_block = 4096 * 16
    assert small._size_pool(small._cache_budget()) == int((100 * GiB * 0.9 - CUDA_ACTIVATION_RESERVE) // per_block)
    reserve = activation_reserve(QWEN3_8B, 32768, 2)
    assert reserve > 5 * GiB
    assert big._size_pool(big._cache_budget()) == int((100 * GiB * 0.9 - reserve) // per_block)


def test_no_room_names_the_token_budget(gpu):
    gpu.free = 6 * GiB  # 5.4 GiB of 0.9 x 6 GiB: no room for 64 blocks
    with pytest.raises(ValueError, match=r"5.44 GiB for the activations of a 32768-token step.*"
                                         r"lower max_num_batched_tokens"):
        runner = Runner(QWEN3_8B, 32768)
        runner._size_pool(runner._cache_budget())


QWEN_32B = dict(hidden_size=5120, intermediate_size=25600, num_attention_heads=64, num_key_value_heads=8,
                head_dim=128)


def fitted(gpu, hf: dict, free_gib: float, tokens: int = 32768, fit: bool = True) -> tuple[int, int]:
    gpu.free = free_gib * GiB
    runner = Runner(hf, tokens)
    runner.cache_cfg.fit_max_num_batched_tokens = fit
    budget = runner._cache_budget()
    if fit:
        budget = runner._fit_max_num_batched_tokens(budget)
    return runner.cache_cfg.max_num_batched_tokens, runner._size_pool(budget)


def test_a_default_token_budget_gives_way_to_the_cache(gpu):
    # qwen3-8b on an H200 (~125 GiB free after its weights): 5.4 GiB of activations is under an eighth; kept
    tokens, blocks = fitted(gpu, QWEN3_8B, 125)
    assert tokens == 32768
    assert blocks == int((125 * GiB * 0.9 - activation_reserve(QWEN3_8B, 32768, 2)) // (4096 * 16))
    # a 32B model on an 80 GiB GPU (~14 GiB free): 32768 tokens would reserve 9.8 of its 12.6 GiB, 16384 4.9;
    # halved down to 8192 (2.5 GiB), the floor: an offline budget is not cut below a server's
    tokens, blocks = fitted(gpu, QWEN_32B, 14)
    assert tokens == FIT_MIN_TOKENS == 8192
    assert blocks == int((14 * GiB * 0.9 - activation_reserve(QWEN_32B, 8192, 2)) // (4096 * 16))
    # a small model whose reserve sits at its 2 GiB floor: halving would free nothing, so nothing is halved
    tiny = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    assert fitted(gpu, tiny, 8)[0] == 32768
    # a budget the user gave is taken as given
    tokens, blocks = fitted(gpu, QWEN_32B, 14, fit=False)
    assert tokens == 32768
    assert blocks == int((14 * GiB * 0.9 - activation_reserve(QWEN_32B, 32768, 2)) // (4096 * 16))


def test_a_model_without_attention_kv_gets_blocks_by_its_sequences():
    """Recurrent layers only: blocks hold no KV (they count tokens for the scheduler and the prefix cache), so the
    pool covers max_num_seqs full-length sequences twice over rather than one block per byte of the budget."""
    runner = Runner()
    runner.kv_bytes_per_token = 0
    runner.cache_cfg.kv_cache_gb = 4.0
    runner.model_cfg.max_model_len = 1000
    assert runner._size_pool(runner._cache_budget()) == 2 * runner.cache_cfg.max_num_seqs * 63 + 1
