"""The server in front of a CUDA engine (CUDA graphs, Triton kernels, async scheduling): what the other server
tests check on CPU, where their engine runs. float32, so the batch a request lands in cannot tip a greedy choice
(bf16 near-ties could); the offline LLM on the same weights and device is the oracle."""
from __future__ import annotations

from typing import Iterator

import pytest
import torch

from ember import SamplingParams

from .conftest import MODEL_NAME, Served
from .helpers import concurrent_stream_texts, random_jobs, stream_text

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def make_cuda_llm(model_dir):
    from ember import LLM
    return LLM(model_dir, dtype="float32", device="cuda", kv_cache_gb=0.05, max_num_seqs=32,
               max_num_batched_tokens=1024, progress=False)


@pytest.fixture(scope="module")
def cuda_reference(model_dir):
    return make_cuda_llm(model_dir)


@pytest.fixture(scope="module")
def cuda_served(model_dir) -> Iterator[Served]:
    from ember.engine.async_engine import AsyncEngine
    from ember.server import build_app
    from ember.server.background import ServerThread

    engine = AsyncEngine(make_cuda_llm(model_dir).engine).start()
    assert engine.core.runner.graphs is not None, "the CUDA engine replays graphs"
    app = build_app(engine, MODEL_NAME, api_key=None)
    with ServerThread(app) as server:
        yield Served(server.url, engine, app)
    engine.shutdown(timeout=2)


def expected(reference, prompt: str, max_tokens: int) -> str:
    return reference.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].outputs[0].text


def test_completion_and_its_stream_equal_the_llm(cuda_served, cuda_reference):
    body = {"model": MODEL_NAME, "prompt": "the mill by the river", "max_tokens": 24, "temperature": 0}
    with cuda_served.client() as client:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        streamed, _ = stream_text(client, "/v1/completions", body)
    assert text == expected(cuda_reference, body["prompt"], 24)
    assert streamed == {0: text}


def test_concurrent_streams_equal_solo(cuda_served, cuda_reference):
    """16 streams at once: batched decode steps (graph replays of 2-16 rows) and mixed prefill steps."""
    jobs = random_jobs(1)
    for (prompt, max_tokens), text in zip(jobs, concurrent_stream_texts(cuda_served.url, jobs)):
        assert text == expected(cuda_reference, prompt, max_tokens)
