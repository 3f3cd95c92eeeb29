"""Recurrent-state slots: a slot's state exports as named tensors (what a host/SSD tier or a checkpoint stores with
a block entry) and loads back into any slot, with names and shapes taken from the model's specs."""
from __future__ import annotations

import torch

from ember.kv.spec import FullAttentionSpec, RecurrentStateSpec, StateTensor, state_bytes_per_slot
from ember.worker.state_cache import StateCache

SPECS = [RecurrentStateSpec((StateTensor("conv", (6, 3)), StateTensor("ssm", (2, 4, 5), torch.float32))),
         FullAttentionSpec(2, 8),
         RecurrentStateSpec((StateTensor("conv", (6, 3)), StateTensor("ssm", (2, 4, 5), torch.float32)))]


def test_state_exports_and_loads_by_name():
    cache = StateCache(SPECS, num_slots=4, dtype=torch.bfloat16, device=torch.device("cpu"))
    assert sorted(cache.layers) == [0, 2]
    assert cache.layers[0]["conv"].dtype == torch.bfloat16 and cache.layers[2]["ssm"].dtype == torch.float32
    for tensors in cache.layers.values():
        for t in tensors.values():
            t[1] = torch.randn(t.shape[1:])
    saved = cache.export(1)
    assert sorted(saved) == ["layers.0.conv", "layers.0.ssm", "layers.2.conv", "layers.2.ssm"]
    assert sum(t.numel() * t.element_size() for t in saved.values()) == state_bytes_per_slot(SPECS, torch.bfloat16)
    cache.load(3, saved)
    for tensors in cache.layers.values():
        for t in tensors.values():
            assert torch.equal(t[3], t[1])
