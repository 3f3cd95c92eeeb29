"""One real engine on a tiny random Qwen3 behind a uvicorn server on a free port, shared by the server tests.

The reference engine (`reference`) is a second LLM on the same weights: server output must equal its output.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import torch

MODEL_NAME = "tiny-qwen3"
MAX_MODEL_LEN = 2048


def build_tiny_qwen3(out_dir: Path) -> Path:
    """A 2-layer Qwen3 with the demo tokenizer (vocab 4096); weights wide enough that greedy text varies."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ember.tokenizer.demo import DEMO_VOCAB_SIZE, build_demo_tokenizer

    build_demo_tokenizer(out_dir)
    cfg = AutoConfig.for_model("qwen3", vocab_size=DEMO_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               max_position_embeddings=MAX_MODEL_LEN, initializer_range=0.5,
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out_dir)
    # greedy by default, so requests that leave temperature unset show the model's defaults are applied
    (out_dir / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    return out_dir


def make_llm(model_dir: Path):
    from ember import LLM
    return LLM(model_dir, dtype="float32", device="cpu", kv_cache_gb=0.05, max_num_seqs=32,
               max_num_batched_tokens=1024, progress=False)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def reference(model_dir):
    """The offline LLM API on the same weights: the oracle for what the server must return."""
    return make_llm(model_dir)


@dataclass
class Served:
    url: str
    engine: Any  # AsyncEngine
    app: Any  # FastAPI

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)


@pytest.fixture(scope="session")
def served(model_dir) -> Iterator[Served]:
    from ember.engine.async_engine import AsyncEngine
    from ember.server import build_app
    from ember.server.background import ServerThread

    engine = AsyncEngine(make_llm(model_dir).engine).start()
    app = build_app(engine, MODEL_NAME, api_key=None)
    with ServerThread(app) as server:
        yield Served(server.url, engine, app)
    engine.shutdown(timeout=2)


@pytest.fixture
def client(served) -> Iterator[httpx.Client]:
    with served.client() as c:
        yield c
