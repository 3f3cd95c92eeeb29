"""Triton kernels for CUDA with the signatures of the torch reference ops in ember.ops (selected there by device).
They also run on CPU tensors under TRITON_INTERPRET=1, which is how the CPU test suite checks them."""
from ember.ops.triton.activation import act_mul, silu_and_mul
from ember.ops.triton.attention import paged_attention, qkv_attention
from ember.ops.triton.gated_delta import gated_delta_decode
from ember.ops.triton.gated_delta import step_rows as gated_delta_step_rows
from ember.ops.triton.gated_delta_prefill import chunk_prepare as gated_delta_chunk_prepare
from ember.ops.triton.gated_delta_prefill import chunk_scan as gated_delta_chunk_scan
from ember.ops.triton.gated_delta_prefill import conv_windows as gated_delta_conv_windows
from ember.ops.triton.gdn import gated_rms_norm, gdn_gating
from ember.ops.triton.gemm import (act_mul_linear, gated_linear, gated_linear_add, gated_linear_parts, linear,
                                  linear_add, rms_norm_add_linear, rms_norm_linear)
from ember.ops.triton.norm import add_rms_norm, rms_norm, rms_norm_add, rms_norm_add_rms_norm
from ember.ops.triton.qkv import prepare_qkv, write_kv
from ember.ops.triton.reduce import row_argmax

__all__ = ["act_mul", "act_mul_linear", "add_rms_norm", "gated_delta_chunk_prepare", "gated_delta_chunk_scan",
           "gated_delta_conv_windows", "gated_delta_decode", "gated_delta_step_rows", "gated_linear",
           "gated_linear_add", "gated_linear_parts", "gated_rms_norm", "gdn_gating", "linear", "linear_add",
           "paged_attention", "prepare_qkv", "qkv_attention", "rms_norm", "rms_norm_add", "rms_norm_add_linear",
           "rms_norm_add_rms_norm", "rms_norm_linear", "row_argmax", "silu_and_mul", "write_kv"]
