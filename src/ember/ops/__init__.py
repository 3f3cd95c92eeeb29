"""Kernels behind one set of signatures: torch reference ops (CPU, oracle) and Triton kernels on CUDA."""
from ember.ops.attention import paged_attention, write_kv

__all__ = ["paged_attention", "write_kv"]
