"""Programmatic dependent launch (PDL, compute capability 9.0+) for the decode kernels.

A decode step is a chain of short kernels; between two of them the GPU normally drains the first grid completely
before it starts launching the second (~1-2 us per boundary, ~290 boundaries per step at batch 1). Launched with
PDL, a kernel may start as soon as every program of the kernel before it has called `release_dependents`; it then
runs whatever does not depend on that kernel (the GEMV loads its first weight tile) and calls `wait_prior`, which
returns once the previous grid has finished and its writes are visible. CUDA graphs keep these edges.

Rules every kernel here follows, so that ordering stays transitive along the chain (a kernel's `wait_prior`
covers only the kernel right before it):
- every program calls `wait_prior` before it reads anything another kernel writes, and before it writes anything;
- every program calls it before it can exit, so no kernel finishes before the one it follows;
- `release_dependents` comes after `wait_prior`, so at most one kernel runs ahead of the one still finishing.
A kernel launched without PDL (cuBLAS, a torch op) simply waits for the previous one as usual.

EMBER_PDL=0 turns it off (for A/B measurements); it is off on CPU tensors (the Triton interpreter has no grid
dependency control) and on GPUs before Hopper.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_override: bool | None = None


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if _override is not None:
        return _override
    if os.environ.get("EMBER_PDL", "1") == "0":
        return False
    return _device_supports(device.index if device.index is not None else torch.cuda.current_device())


def set_enabled(value: bool | None) -> None:
    """Forces PDL on or off for kernels launched from now on (None: back to the default). For benchmarks: a
    CUDA graph keeps the launch mode it was captured with."""
    global _override
    _override = value


def launch_args(device: torch.device) -> dict:
    """Keyword arguments for a kernel launch: the USE_PDL constexpr, and Triton's launch_pdl flag when on."""
    return dict(USE_PDL=True, launch_pdl=True) if enabled(device) else dict(USE_PDL=False)


@triton.jit
def wait_prior(USE_PDL: tl.constexpr):
    """Blocks until the kernel this one follows has finished and its memory is visible (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_dependents(USE_PDL: tl.constexpr):
    """Lets the next kernel start launching once every program of this one has called it (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
