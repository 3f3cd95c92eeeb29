import random

import pytest

from ember.worker.attn_metadata import padded_tables, step_positions, token_slots


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_step_positions_and_slots_equal_a_lookup_per_token(block_size):
    """A step's sequences (prompt chunks starting inside a block, decodes, whole prompts) on scattered blocks: every
    token's position and pool slot as a per-token lookup in its own block list would give them."""
    rng = random.Random(block_size)
    for _ in range(50):
        blocks, starts, lens = [], [], []
        for _ in range(rng.randrange(1, 9)):
            ids = rng.sample(range(1, 1000), rng.randrange(1, 12))
            start = rng.randrange(0, block_size * len(ids))
            blocks.append(ids)
            starts.append(start)
            lens.append(rng.randrange(1, block_size * len(ids) - start + 1))
        width = max(-(-(s + n) // block_size) for s, n in zip(starts, lens))
        tables = padded_tables(blocks, width)
        seq, pos = step_positions(starts, lens)
        slots = token_slots(tables, seq, pos, block_size)
        want_pos = [p for s, n in zip(starts, lens) for p in range(s, s + n)]
        want_slots = [ids[p // block_size] * block_size + p % block_size
                      for ids, s, n in zip(blocks, starts, lens) for p in range(s, s + n)]
        assert pos.tolist() == want_pos and slots.tolist() == want_slots
        assert tables.shape == (len(blocks), width)
        assert all(tables[i, :min(width, len(ids))].tolist() == ids[:width] for i, ids in enumerate(blocks))
