"""SiLU(gate) * up in one pass over the fused gate/up projection (rounded where the torch reference rounds)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops.triton import pdl
from ember.ops.triton.pdl import release_dependents, wait_prior


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_o, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (act * up).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    x2 = gate_up.reshape(-1, 2 * n)
    out = torch.empty(x2.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, out, n, x2.stride(0), out.stride(0), BLOCK=block,
                                                             **pdl.launch_args(x2.device))
    return out.view(*gate_up.shape[:-1], n)
