"""Kernels behind one set of signatures: torch reference ops (the CPU path and the oracle for GPU kernels) and,
on CUDA, the Triton kernels of ember.ops.triton with the same signatures. Each op is selected by the device of
its first tensor argument; EMBER_TRITON=0 keeps the references on CUDA too (for A/B checks), EMBER_TRITON_SKIP=a,b
those ops only."""
from __future__ import annotations

import importlib
import os
from typing import Callable

from ember.ops import activation, attention, gated_delta, gemm, norm, reduce
from ember.ops.rotary import apply_rotary

USE_TRITON = os.environ.get("EMBER_TRITON", "1") != "0"
SKIPPED = frozenset(filter(None, os.environ.get("EMBER_TRITON_SKIP", "").split(",")))
# tests set this (with TRITON_INTERPRET=1) to run the Triton kernels on CPU tensors through the whole engine: the
# GPU path's integration (mixed steps, greedy argmax, the GEMV prologues) checked without a GPU
TRITON_ON_CPU = False


def triton_enabled(*ops: str) -> bool:
    """Whether the Triton kernels run on CUDA: all of them, or with names, those ops (none in EMBER_TRITON_SKIP)."""
    return USE_TRITON and not SKIPPED.intersection(ops)


def _select(name: str, reference: Callable) -> Callable:
    if name in SKIPPED:
        return reference
    gpu: Callable | None = None

    def op(x, *args, **kwargs):
        nonlocal gpu
        if (x.is_cuda or TRITON_ON_CPU) and USE_TRITON:
            if gpu is None:  # triton is imported on first CUDA use only: it is not a CPU dependency
                gpu = getattr(importlib.import_module("ember.ops.triton"), name)
            return gpu(x, *args, **kwargs)
        return reference(x, *args, **kwargs)

    op.__name__, op.__doc__ = name, reference.__doc__
    return op


write_kv = _select("write_kv", attention.write_kv)
paged_attention = _select("paged_attention", attention.paged_attention)
prepare_qkv = _select("prepare_qkv", attention.prepare_qkv)
qkv_attention = _select("qkv_attention", attention.qkv_attention)
rms_norm = _select("rms_norm", norm.rms_norm)
add_rms_norm = _select("add_rms_norm", norm.add_rms_norm)
rms_norm_add = _select("rms_norm_add", norm.rms_norm_add)
rms_norm_add_rms_norm = _select("rms_norm_add_rms_norm", norm.rms_norm_add_rms_norm)
gated_rms_norm = _select("gated_rms_norm", norm.gated_rms_norm)
act_mul = _select("act_mul", activation.act_mul)
gdn_gating = _select("gdn_gating", activation.gdn_gating)
gated_delta_decode = _select("gated_delta_decode", gated_delta.gated_delta_decode)
gated_delta_chunk_prepare = _select("gated_delta_chunk_prepare", gated_delta.chunk_prepare)
gated_delta_chunk_scan = _select("gated_delta_chunk_scan", gated_delta.chunk_scan)
gated_delta_conv_windows = _select("gated_delta_conv_windows", gated_delta.conv_windows)
gated_delta_step_rows = _select("gated_delta_step_rows", gated_delta.step_rows)
# a chunked Gated DeltaNet step's ops by gated_delta.gated_delta_prefill's keywords: the layers pass them, and a
# hybrid's mixed steps are captured only while all of them are Triton kernels (the torch references plan on the host)
GATED_DELTA_CHUNKED = dict(prepare=gated_delta_chunk_prepare, scan=gated_delta_chunk_scan,
                           windows=gated_delta_conv_windows, step=gated_delta_step_rows)
linear = _select("linear", gemm.linear)
linear_add = _select("linear_add", gemm.linear_add)
gated_linear_add = _select("gated_linear_add", gemm.gated_linear_add)
gated_linear = _select("gated_linear", gemm.gated_linear)
act_mul_linear = _select("act_mul_linear", gemm.act_mul_linear)
gated_linear_parts = _select("gated_linear_parts", gemm.gated_linear_parts)
rms_norm_linear = _select("rms_norm_linear", gemm.rms_norm_linear)
rms_norm_add_linear = _select("rms_norm_add_linear", gemm.rms_norm_add_linear)
row_argmax = _select("row_argmax", reduce.row_argmax)

__all__ = ["act_mul", "act_mul_linear", "add_rms_norm", "apply_rotary", "gated_delta_chunk_prepare",
           "gated_delta_chunk_scan", "gated_delta_conv_windows", "gated_delta_decode", "gated_delta_step_rows",
           "gated_linear", "gated_linear_add", "gated_linear_parts", "gated_rms_norm", "gdn_gating", "linear",
           "linear_add", "paged_attention", "prepare_qkv", "qkv_attention", "rms_norm", "rms_norm_add",
           "rms_norm_add_linear", "rms_norm_add_rms_norm", "rms_norm_linear", "row_argmax", "triton_enabled",
           "write_kv"]

if SKIPPED - set(__all__):
    raise ValueError(f"EMBER_TRITON_SKIP names unknown ops {sorted(SKIPPED - set(__all__))}; "
                     f"allowed: {', '.join(n for n in __all__ if n not in ('apply_rotary', 'triton_enabled'))}")
