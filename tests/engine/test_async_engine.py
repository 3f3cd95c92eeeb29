from __future__ import annotations

import asyncio

import pytest

from ember import LLM, SamplingParams
from ember.engine.async_engine import AsyncEngine


def test_stream_abort_and_shutdown(demo_dir):
    engine = AsyncEngine(LLM(str(demo_dir), progress=False).engine).start()
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)

    async def scenario():
        deltas = []
        async for delta in engine.generate("a", [5, 6, 7, 8], params):
            deltas.append(delta)
            if len(deltas) == 3:
                engine.abort("a")
        return deltas

    deltas = asyncio.run(scenario())
    last = deltas[-1]
    assert last.finished and last.finish_reason == "abort" and last.num_prompt_tokens == 4
    assert 3 <= sum(len(d.new_token_ids) for d in deltas) < 200
    assert engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0
    engine.shutdown(timeout=1)

    async def after():
        async for _ in engine.generate("b", [5, 6], params):
            pass

    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(after())
