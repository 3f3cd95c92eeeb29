"""SiLU(gate) * up in one pass over the fused gate/up projection (rounded where the torch reference rounds)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops.triton import pdl
from ember.ops.triton.overrides import env_launch
from ember.ops.triton.pdl import release_dependents, wait_prior

# EMBER_SILU_TILE="BLOCK,ROWS,num_warps": the launch's tile on a GPU, for measuring (benchmarks/small_kernels.py)
TILE_OVERRIDE = env_launch("EMBER_SILU_TILE", ("BLOCK", "ROWS", "num_warps"))


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_o, BLOCK: tl.constexpr,
                         ROWS: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (offs < n_cols)[None, :]
    dtype = out_ptr.dtype.element_ty
    x_row = x_ptr + rows.to(tl.int64)[:, None] * stride_x + offs[None, :]
    gate = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + offs[None, :], (act * up).to(dtype), mask=mask)


def silu_config(n: int, rows: int) -> dict:
    # after qwen3-8b's gate/up GEMM at 256 rows, 4 rows x 1024 columns per program with 8 warps took 3.7 us against
    # 4.7 for a row x 1024 with 4 warps; at 128 rows the two were within the noise (benchmarks/small_kernels.py)
    if TILE_OVERRIDE:
        return dict(TILE_OVERRIDE)
    block = min(1024, triton.next_power_of_2(n))
    return dict(BLOCK=block, ROWS=4, num_warps=8) if rows >= 192 else dict(BLOCK=block, ROWS=1, num_warps=4)


def silu_and_mul(gate_up: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    x2 = gate_up.reshape(-1, 2 * n)
    out = torch.empty(x2.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    cfg = dict(config or silu_config(n, x2.shape[0]))
    grid = (triton.cdiv(x2.shape[0], cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK"]))
    _silu_and_mul_kernel[grid](x2, out, x2.shape[0], n, x2.stride(0), out.stride(0), **cfg,
                               **pdl.launch_args(x2.device))
    return out.view(*gate_up.shape[:-1], n)
