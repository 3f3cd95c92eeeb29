import random

import pytest

from ember.worker.model_runner import _slots


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_slots_equal_a_lookup_per_token(block_size):
    rng = random.Random(block_size)
    for _ in range(300):
        blocks = rng.sample(range(1, 1000), 12)
        start = rng.randrange(0, block_size * 11)
        n = rng.randrange(1, block_size * 12 - start + 1)
        expected = [blocks[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
        assert _slots(blocks, start, n, block_size) == expected, (start, n)
