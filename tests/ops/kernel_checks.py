"""Setup shared by the Triton kernel tests: without CUDA the kernels run on CPU tensors under TRITON_INTERPRET=1
(float32 only: the interpreter's bf16 arithmetic truncates); with CUDA compiled, in float32 and bfloat16.
Import this before ember.ops.triton: the interpreter flag is read when its kernels are defined."""
from __future__ import annotations

import inspect
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _cache_interpreter_patch_scan() -> None:
    """The interpreter re-patches triton.language on every launch and on every call of a @triton.jit helper inside
    a kernel, and each patch scans its module with inspect.getmembers: ~30% of an interpreted engine test. Scan
    each module once for the names of its builtins, then patch those of them that are still builtins, as the scan
    would (what a patch finds is unchanged; a patched member is no builtin, as before)."""
    try:
        from triton.language import core
        from triton.runtime import interpreter
    except ImportError:
        return
    scan = getattr(interpreter, "_patch_builtin", None)
    if scan is None or getattr(scan, "cached", False) or not hasattr(interpreter, "_patch_attr"):
        return  # another Triton: leave it as it is
    names: dict[int, tuple[object, list[str]]] = {}

    def patch_builtin(pkg, builder, scope):
        if id(pkg) not in names:
            names[id(pkg)] = (pkg, [n for n, m in inspect.getmembers(pkg) if core.is_builtin(m)])
        for name in names[id(pkg)][1]:
            member = getattr(pkg, name)
            if core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    patch_builtin.cached = True
    interpreter._patch_builtin = patch_builtin


if os.environ.get("TRITON_INTERPRET") == "1":
    _cache_interpreter_patch_scan()

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
