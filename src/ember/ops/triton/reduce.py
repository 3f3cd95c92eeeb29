"""Row argmax over wide rows (greedy sampling over the vocabulary) in two small kernels: each program takes the
first maximum of one chunk of a row, then one program per row picks the first chunk holding the row's maximum.

torch's argmax over [256, 151,936] bf16 logits took 64 us on an H200 (one block per row streams the row); split in
chunks the grid covers every SM. Ties go to the lowest index, as in torch.argmax. NaN is taken as +inf (torch
returns the first NaN; the two differ only when an inf comes before it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops.triton import pdl
from ember.ops.triton.attention import _num_sms
from ember.ops.triton.overrides import env_launch
from ember.ops.triton.pdl import release_dependents, wait_prior

# BLOCK: columns per program per iteration; PROGRAMS_PER_SM: the chunk programs over the whole batch per SM. Timed
# after the LM head GEMM on an H200 (benchmarks/small_kernels.py, 256 x 151,936): 2048 columns, 8 warps and 4
# programs per SM (3 chunks per row) took 32.4 us, the earlier 4 warps and 16 per SM 58.0 us; all of the ten fastest
# of 32 had 8 warps and 4-8 per SM. EMBER_ARGMAX_CONFIG="BLOCK,num_warps,PROGRAMS_PER_SM" replaces it, for measuring.
ARGMAX_CONFIG = (env_launch("EMBER_ARGMAX_CONFIG", ("BLOCK", "num_warps", "PROGRAMS_PER_SM"))
                 or dict(BLOCK=2048, num_warps=8, PROGRAMS_PER_SM=4))
# fewer rows keep torch.argmax: one launch against two, and the 64 us measured was at batch 256
MIN_ROWS = 16
MAX_CHUNKS = 64  # chunks per row; the second kernel reads a fixed 64, so one variant serves every row count


@triton.jit
def _first_max(v, i):
    # [BLOCK] values and their column indices -> (max, smallest index holding it)
    m = tl.max(v, axis=0)
    return m, tl.min(tl.where(v == m, i, 2147483647), axis=0)


@triton.jit(do_not_specialize=["chunk", "num_chunks"])  # vary with the row count: one compiled variant for all
def _argmax_chunk_kernel(x_ptr, val_ptr, idx_ptr, n_cols, chunk, num_chunks, stride_x,
                         BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    start = c * chunk
    end = tl.minimum(start + chunk, n_cols)
    offs = tl.arange(0, BLOCK)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 2147483647, tl.int32)
    for off in range(start, end, BLOCK):
        cols = off + offs
        v = tl.load(x_ptr + row * stride_x + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
        v = tl.where(v != v, float("inf"), v)
        upd = v > best_v  # strict: each lane keeps its earliest column of a tie
        best_v = tl.where(upd, v, best_v)
        best_i = tl.where(upd, cols, best_i)
    # a lane that saw only -inf still holds index 2**31 - 1; a row of all -inf needs its first column
    best_i = tl.where((best_v == float("-inf")) & (best_i == 2147483647), start + offs, best_i)
    m, i = _first_max(best_v, best_i)
    tl.store(val_ptr + row * num_chunks + c, m)
    tl.store(idx_ptr + row * num_chunks + c, i)


@triton.jit(do_not_specialize=["num_chunks"])
def _argmax_rows_kernel(val_ptr, idx_ptr, out_ptr, num_chunks, CHUNKS_PAD: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNKS_PAD)
    mask = offs < num_chunks
    v = tl.load(val_ptr + row * num_chunks + offs, mask=mask, other=float("-inf"))
    i = tl.load(idx_ptr + row * num_chunks + offs, mask=mask, other=2147483647)
    _, best = _first_max(v, i)  # chunks are in column order: the smallest index is the first chunk's
    tl.store(out_ptr + row, best.to(tl.int64))


def row_argmax(x: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """[R, N] -> [R] int64, as ember.ops.reduce.row_argmax. config (benchmarks): BLOCK, num_warps and
    PROGRAMS_PER_SM, the chunk programs the grid aims at per SM over the whole batch."""
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[0] < MIN_ROWS:
        return x.argmax(dim=-1)
    cfg = dict(ARGMAX_CONFIG, **(config or {}))
    rows, n = x.shape
    block = cfg["BLOCK"]
    # chunks of a multiple of BLOCK columns, enough of them over the batch to give each SM PROGRAMS_PER_SM
    # (256 x 151,936 at 4 per SM: 3 chunks per row, 768 programs)
    num_chunks = max(1, min(MAX_CHUNKS, triton.cdiv(cfg["PROGRAMS_PER_SM"] * _num_sms(x.device), rows),
                            triton.cdiv(n, block)))
    chunk = triton.cdiv(triton.cdiv(n, num_chunks), block) * block
    num_chunks = triton.cdiv(n, chunk)
    vals = torch.empty(rows, num_chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, num_chunks, dtype=torch.int32, device=x.device)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    _argmax_chunk_kernel[(rows, num_chunks)](x, vals, idx, n, chunk, num_chunks, x.stride(0), BLOCK=block,
                                             num_warps=cfg["num_warps"], **pdl.launch_args(x.device))
    _argmax_rows_kernel[(rows,)](vals, idx, out, num_chunks, CHUNKS_PAD=MAX_CHUNKS,
                                 num_warps=1, **pdl.launch_args(x.device))
    return out
