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


def test_copy_slots_and_scratch_slot():
    """copy_slots copies whole slots in every recurrent layer at once; one scratch slot lies past the pool's ids."""
    cache = StateCache(SPECS, num_slots=4, dtype=torch.float32, device=torch.device("cpu"))
    assert cache.scratch_slot == 4
    for tensors in cache.layers.values():
        for t in tensors.values():
            assert t.shape[0] == 5
            t.copy_(torch.randn(t.shape))
    before = {(i, name): t.clone() for i, d in cache.layers.items() for name, t in d.items()}
    cache.copy_slots(torch.tensor([0, 1]), torch.tensor([3, 2]))
    for (i, name), old in before.items():
        t = cache.layers[i][name]
        assert torch.equal(t[3], old[0]) and torch.equal(t[2], old[1])
        assert torch.equal(t[:2], old[:2]) and torch.equal(t[4], old[4])
