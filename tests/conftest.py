"""Shared fixtures: small random-weight HF models built with transformers (the oracle), cached per session."""
from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
