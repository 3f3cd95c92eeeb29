"""act(gate) * up in one pass (rounded where the torch reference rounds): over a fused gate/up projection
(silu_and_mul), or over separate gate and up tensors (act_mul: Gemma 4's per-layer input gate)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops import activation as reference
from ember.ops.triton import pdl
from ember.ops.triton.overrides import env_launch
from ember.ops.triton.pdl import release_dependents, wait_prior

# EMBER_SILU_TILE="BLOCK,ROWS,num_warps": the launch's tile on a GPU, for measuring (benchmarks/small_kernels.py)
TILE_OVERRIDE = env_launch("EMBER_SILU_TILE", ("BLOCK", "ROWS", "num_warps"))


# the activations a gated kernel applies (ember.ops.activation.ACTIVATIONS by name)
ACT_CODES = {"silu": 1, "gelu_pytorch_tanh": 2, "gelu_new": 2, "gelu": 3}


@triton.jit
def act_fn(x, ACT: tl.constexpr):
    """x: float32; ACT: an ACT_CODES value."""
    if ACT == 1:
        return x * tl.sigmoid(x)
    elif ACT == 2:  # tanh approximation: 0.5 x (1 + tanh(u)) = x * sigmoid(2u)
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    else:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def _act_mul_kernel(g_ptr, u_ptr, out_ptr, n_rows, n_cols, stride_g, stride_u, stride_o, ACT: tl.constexpr,
                    BLOCK: tl.constexpr, ROWS: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (offs < n_cols)[None, :]
    dtype = out_ptr.dtype.element_ty
    rows64 = rows.to(tl.int64)[:, None]
    gate = tl.load(g_ptr + rows64 * stride_g + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + rows64 * stride_u + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    act = act_fn(gate, ACT).to(dtype).to(tl.float32)
    tl.store(out_ptr + rows64 * stride_o + offs[None, :], (act * up).to(dtype), mask=mask)


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
    _launch(x2[:, :n], x2[:, n:], out, "silu", config)
    return out.view(*gate_up.shape[:-1], n)


def _launch(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor, act: str, config: dict | None) -> None:
    """gate, up, out: [rows, n] with unit column stride."""
    rows, n = out.shape
    cfg = dict(config or silu_config(n, rows))
    grid = (triton.cdiv(rows, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK"]))
    _act_mul_kernel[grid](gate, up, out, rows, n, gate.stride(0), up.stride(0), out.stride(0), ACT=ACT_CODES[act],
                          **cfg, **pdl.launch_args(out.device))


def act_mul(gate: torch.Tensor, up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    if act not in ACT_CODES:
        return reference.act_mul(gate, up, act)
    n = gate.shape[-1]
    g2, u2 = gate.reshape(-1, n), up.reshape(-1, n)
    if g2.stride(-1) != 1:
        g2 = g2.contiguous()
    if u2.stride(-1) != 1:
        u2 = u2.contiguous()
    out = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
    _launch(g2, u2, out, act, None)
    return out.view(gate.shape)
