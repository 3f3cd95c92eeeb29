"""Shared fixtures: small random-weight HF models built with transformers (the oracle), cached per session."""
from __future__ import annotations

import os

import pytest
import torch

# two torch threads a test process, fewer where pytest-xdist runs a worker per core (`-n auto`)
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))


@pytest.hookimpl(optionalhook=True)  # runs without pytest-xdist too (`-p no:xdist`)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, up to 8 (most of the suite's time is single-threaded Python: the Triton
    interpreter); one process where there is a GPU, whose tests share the device and compile kernels."""
    return 0 if torch.cuda.is_available() else max(1, min(8, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def model_builder_cache(tmp_path_factory, build):
    """name -> (model dir, transformers model), each written by build(name, dir) once and then reused."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            d = tmp_path_factory.mktemp(name)
            cache[name] = (d, build(name, d))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """The tiny configs of tests/parity/models.py, built once per session."""
    from tests.parity.models import build_hf_model

    return model_builder_cache(tmp_path_factory, build_hf_model)


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory):
    """The tiny hybrid configs of tests/parity/hybrid_models.py (Gated DeltaNet, sliding windows), built once per
    session."""
    from tests.parity.hybrid_models import build_hybrid_model

    return model_builder_cache(tmp_path_factory, build_hybrid_model)


@pytest.fixture(scope="session")
def bf16_models(tmp_path_factory):
    """The bf16 configs of tests/parity/hybrid_models.py at real-model weight scales, built once per session."""
    from tests.parity.hybrid_models import build_bf16_model

    return model_builder_cache(tmp_path_factory, build_bf16_model)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory):
    """The tiny demo model (Qwen3 shape, with the demo tokenizer), written to a temp dir."""
    from ember.demo import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("demo"), "tiny")
