"""Setup shared by the Triton kernel tests: without CUDA the kernels run on CPU tensors under TRITON_INTERPRET=1
(float32 only: the interpreter's bf16 arithmetic truncates); with CUDA compiled, in float32 and bfloat16.
Import this before ember.ops.triton: the interpreter flag is read when its kernels are defined."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter of Triton 3.5 and 3.6 fails on the paged decode kernel (a numpy scalar conversion); compiled on
# CUDA any version torch pairs with will do. For pytest.importorskip("triton", minversion=...).
TRITON_MIN_VERSION = None if DEVICE == "cuda" else "3.7"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    """Relative error in the 2-norm, the way bf16 kernels are judged."""
    assert torch.isfinite(a).all()
    err = (a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)
    assert err.item() < tol, f"relative error {err.item():.2e}"
