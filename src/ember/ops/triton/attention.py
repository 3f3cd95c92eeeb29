"""Paged attention over the block pool [2, num_blocks, block_size, num_kv_heads, head_dim]: a decode kernel
(one query per sequence) and a prefill kernel (any query lengths, cached context included). Online softmax as
in FlashAttention (Dao et al., arXiv:2205.14135); decode splits each sequence's keys over a fixed number of
programs (flash-decoding) and merges the partial results in a second kernel. qkv_attention's decode can also do
prepare_qkv's work in the decode kernel (off by default, see FUSE_MAX_PROGRAMS_PER_SM): each program norms and
rotates its query heads, and one program per kv head writes the new token's k and v into the pool and attends to
it from registers.

Prefill sequences with many queries (FLASH_PREFILL_MIN_QUERY) go to torch's flash attention instead, one SDPA
call each over keys gathered from the pool; the prefill kernel skips them.

Nothing in the decode path reads host-side lengths except the grid sizes (number of sequences), so a decode
step can be captured in a CUDA graph: each program finds its sequence's length and blocks on the device.
Same contracts as ember.ops.attention.paged_attention and qkv_attention.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention.bias import causal_lower_right
from triton.runtime.errors import OutOfResources

from ember.config import KV_CACHE_DTYPES
from ember.ops.attention import gather_blocks
from ember.ops.triton import pdl
from ember.ops.triton.overrides import env_launch
from ember.ops.triton.pdl import release_dependents, wait_prior
from ember.ops.triton.qkv import _norm_rope, prepare_qkv, to_pool

from ember.worker.attn_metadata import AttentionMetadata

MAX_SPLITS = 16
# qkv_attention can fuse prepare_qkv into the decode kernel up to this many (sequence, kv head) programs per SM
# (EMBER_FUSE_DECODE_PROGRAMS_PER_SM). Off by default: on the H200 it was a wash at small batch (layer time from
# the qkv rows, us, fused vs prepare_qkv + attention: batch 1 x 2048 13.9 vs 14.1, 1 x 256 8.7 vs 9.0; 64 x 2048
# 129.5 vs 131.4) and a loss over several waves (256 x 256: 82.4 vs 78.6): its prologue's dependent loads (position,
# cos/sin, q) come before the first KV load and lengthen every program. benchmarks/attention.py times both.
FUSE_MAX_PROGRAMS_PER_SM = int(os.environ.get("EMBER_FUSE_DECODE_PROGRAMS_PER_SM", "0"))
# a mixed step's leading one-token sequences go to the decode kernel from this many on: in the prefill kernel each
# fills a whole BLOCK_M query tile for one row (a batch-256 run's mixed steps spent ~300 us per layer on them)
MIXED_DECODE_MIN_SEQS = 16
# Prefill sequences with at least this many queries in a step go to torch's flash attention (SDPA over the
# sequence's keys gathered from the pool, causal from the bottom right), the rest to the prefill kernel, which
# skips them. On an H200 (benchmarks/attention.py, qwen3-8b heads, us per layer, this way vs the kernel):
# 1 x 8192 tokens 972 vs 1,697; 2 x 4096 575 vs 947; 4 x 2048 403 vs 498; 4 x 1536 272 vs 310; but 8 x 1024 347
# vs 305 (one SDPA call, two KV gathers and an output copy per sequence; SDPA over the padded batch takes 153).
# The kernel's time grows with the square of the length, the per-call costs do not. Sliding windows and
# soft-capping stay in the kernel; an fp8 pool's keys are gathered in the model dtype. 0: off.
FLASH_PREFILL_MIN_QUERY = int(os.environ.get("EMBER_FLASH_PREFILL_MIN_QUERY", "1536"))
# EMBER_DECODE_TILE="BLOCK_N,num_warps,num_stages": the unsplit decode launch's tile on a GPU, for measuring
# alternatives inside a real run (benchmarks/gpu_decode.py), where clocks and the pool differ from a
# microbenchmark (five tiles made no difference: benchmarks/NOTES-gpu.md, v9)
DECODE_TILE = env_launch("EMBER_DECODE_TILE", ("BLOCK_N", "num_warps", "num_stages"))
LOG2E = 1.4426950408889634
FP8 = tuple(KV_CACHE_DTYPES.values())
# EMBER_PREFILL_PACK_GQA=0: the prefill kernel's tiles hold one query head each (A/B measurements)
PREFILL_PACK_GQA = os.environ.get("EMBER_PREFILL_PACK_GQA", "1") != "0"


@triton.jit
def _cap(s, scale_log2, softcap, HAS_SOFTCAP: tl.constexpr):
    # raw q.k -> scaled (and soft-capped) scores in log2 units
    if HAS_SOFTCAP:
        s = s * (scale_log2 / 1.4426950408889634)
        s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0) * 1.4426950408889634  # softcap * tanh(s / softcap)
    else:
        s = s * scale_log2
    return s


@triton.jit
def _scores(q, k, scale_log2, softcap, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    # q [M, D], k [N, D] -> scores [M, N] in log2 units
    return _cap(tl.dot(q, tl.trans(k), input_precision=PRECISION), scale_log2, softcap, HAS_SOFTCAP)


@triton.jit
def _load_kv(k_ptr, v_ptr, table_ptr, pos, n_mask, d_mask, kv_head, offs_d,
             stride_kb, stride_ks, stride_kh, BLOCK_SIZE: tl.constexpr):
    blk = tl.load(table_ptr + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    off = blk * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
    mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_ptr + off[:, None] + offs_d[None, :], mask=mask, other=0.0)
    v = tl.load(v_ptr + off[:, None] + offs_d[None, :], mask=mask, other=0.0)
    return k, v


@triton.jit
def _load_kv_full(k_ptr, v_ptr, table_ptr, tile, d_mask, kv_head, offs_n, offs_d, stride_kb, stride_ks, stride_kh,
                  BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                  I64: tl.constexpr):
    """A key tile every key of which is in the sequence: no key masks, and (a power-of-two block size) each pool
    block's row offsets are constants over the tile, so the compiler adds them to one base address per block. With
    _lazy_softmax_step this took a one-warp program's loop from 817 to 394 instructions per 32-key tile (sm_90,
    Triton 3.6, benchmarks/decode_sass.py; masks and a 64-bit multiply-add per row were most of those saved).
    I64: offsets past 2**31 elements."""
    if BLOCK_N >= BLOCK_SIZE:
        blk = tl.load(table_ptr + tile * (BLOCK_N // BLOCK_SIZE) + offs_n // BLOCK_SIZE)
        slot = offs_n % BLOCK_SIZE
    else:  # the tile lies inside one block
        blk = tl.load(table_ptr + (tile * BLOCK_N) // BLOCK_SIZE + offs_n * 0)
        slot = (tile * BLOCK_N) % BLOCK_SIZE + offs_n
    if I64:
        blk = blk.to(tl.int64)
    off = blk * stride_kb + slot * stride_ks + kv_head * stride_kh
    ptrs = off[:, None] + offs_d[None, :]
    if HEAD_DIM == D_PAD:
        return tl.load(k_ptr + ptrs), tl.load(v_ptr + ptrs)
    return (tl.load(k_ptr + ptrs, mask=d_mask[None, :], other=0.0),
            tl.load(v_ptr + ptrs, mask=d_mask[None, :], other=0.0))


@triton.jit
def _dot_operand(q, k_ptr):
    """q in the dtype of the attention dots: over an fp8 pool a bf16 model's dots run in fp16, since fp8 -> fp16 is
    one conversion instruction per two values and fp8 -> bf16 is not (fp8 values are exact in fp16; queries and
    softmax probabilities fit its range, at more precision than bf16's); accumulators stay float32."""
    if k_ptr.dtype.element_ty == tl.float8e4nv and q.dtype == tl.bfloat16:
        q = q.to(tl.float16)
    return q


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet stay at zero
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _masked_tile(q, k_ptr, v_ptr, table, tile, kv_len, lo, d_mask, kv_head, offs_n, offs_d, stride_kb, stride_ks,
                 stride_kh, scale_log2, softcap, m_i, l_i, acc, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """A decode key tile with keys outside [lo, kv_len): those are neither loaded nor attended to."""
    pos = tile * BLOCK_N + offs_n
    n_mask = (pos < kv_len) & (pos >= lo)
    k, v = _load_kv(k_ptr, v_ptr, table, pos, n_mask, d_mask, kv_head, offs_d, stride_kb, stride_ks, stride_kh,
                    BLOCK_SIZE)
    s = _scores(q, k.to(q.dtype), scale_log2, softcap, HAS_SOFTCAP, PRECISION)
    s = tl.where(n_mask[None, :], s, float("-inf"))
    return _online_softmax_step(s, v.to(q.dtype), m_i, l_i, acc, PRECISION)


@triton.jit
def _lazy_softmax_step(s, v, m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr):
    """_online_softmax_step that moves a row's reference maximum only when a tile's scores exceed it by more than
    2^8 (FlashAttention-4's conditional rescaling): most tiles then skip rescaling the accumulator. Exact: the
    probabilities stay below 256 against the stale maximum (fp32 sums, bf16/fp16 dot operands), and the sums,
    the accumulator and the split merge all use the same reference. Rows that saw no key yet (m = -inf) take the
    first tile's maximum. s: raw scores, scaled to log2 units here by scale_log2 (> 0) inside the exponent's
    multiply-add (1.0 for scores already scaled)."""
    m_tile = tl.max(s, 1) * scale_log2
    if tl.max((m_tile > m_i + 8.0).to(tl.int32), 0) > 0:
        m_new = tl.maximum(m_i, m_tile)
        alpha = tl.math.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    p = tl.math.exp2(s * scale_log2 - m_i[:, None])
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return m_i, l_i + tl.sum(p, 1), acc


# Triton compiles a variant per value class of each integer argument (1, a multiple of 16, other) and per 16-byte
# alignment of each pointer. A mixed step's block-table width and its metadata slices (_decode_prefix) change from
# step to step; they feed scalar loads and address arithmetic only, so the kernels do not specialize on them and
# the variant compiled at start-up (ModelRunner.warm_up) serves every step.
@triton.jit(do_not_specialize=["stride_bt"],
            do_not_specialize_on_alignment=["table_ptr", "seq_lens_ptr", "positions_ptr", "slot_ptr"])
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    positions_ptr, slot_ptr, q_w_ptr, k_w_ptr, cos_sin_ptr, eps,
    scale_log2, softcap, window, num_splits,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS_PAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, IS_SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    HEADS_FIRST: tl.constexpr, FUSED_QKV: tl.constexpr, HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr,
    ROT_DIM: tl.constexpr, USE_PDL: tl.constexpr, I64: tl.constexpr,
):
    """One program per (sequence, kv head, split): the GROUP query heads of that kv head against the split's keys.

    FUSED_QKV: q_ptr is the qkv projection's output; the program does prepare_qkv's work for its heads (q/k norm,
    rotary), takes the new token's k and v from registers and writes them into the pool (the last split's program).
    IS_SPLIT: each split stores its partial result (empty splits too, as m = -inf); _decode_merge_kernel merges."""
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    # HEADS_FIRST: grid (kv_heads, seqs, splits), so the programs of one sequence's heads run side by side
    if HEADS_FIRST:
        seq = tl.program_id(1).to(tl.int64)
        kv_head = tl.program_id(0)
        num_kv_heads = tl.num_programs(0)
    else:
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
        num_kv_heads = tl.num_programs(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    dtype = q_ptr.dtype.element_ty
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < HEAD_DIM
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    qo_mask = g_mask[:, None] & d_mask[None, :]
    row = q_ptr + seq * stride_qt
    if FUSED_QKV:  # the same rounding as prepare_qkv, which stores q in the model dtype
        cos_ptr = cos_sin_ptr
        if HAS_ROPE:
            cos_ptr = cos_sin_ptr + tl.load(positions_ptr + seq).to(tl.int64) * (2 * ROT_DIM)
        # norms as Llama's (False, 0.0: ember.ops.norm's weight_offset None); qkv_attention fuses no other kind
        q = _norm_rope(row + kv_head * GROUP * HEAD_DIM, q_w_ptr, cos_ptr, cos_ptr + ROT_DIM, eps, GROUP,
                       HEAD_DIM, GROUP_PAD, D_PAD, ROT_DIM, HAS_NORM, HAS_ROPE, False, 0.0).to(dtype)
        kv_len = seq_len - 1  # keys in the pool; the new token's come from registers
    else:
        q = tl.load(row + heads[:, None] * stride_qh + offs_d[None, :], mask=qo_mask, other=0.0)
        kv_len = seq_len
    q = _dot_operand(q, k_ptr)
    dtype = q.dtype
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    first_tile = lo // BLOCK_N
    num_tiles = tl.maximum(tl.cdiv(kv_len, BLOCK_N) - first_tile, 0)
    per_split = tl.cdiv(num_tiles, num_splits)
    tile_begin = first_tile + split * per_split
    tile_end = tl.minimum(tile_begin + per_split, first_tile + num_tiles)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    table = table_ptr + seq * stride_bt
    # Tiles whose keys all lie in [lo, kv_len) load without masks; the partial ones at either end (the last
    # tile; the first under a sliding window) take the masked path. See _load_kv_full.
    full_lo = tl.maximum(tile_begin, tl.cdiv(lo, BLOCK_N))
    full_hi = tl.maximum(tl.minimum(tile_end, kv_len // BLOCK_N), full_lo)
    if HAS_WINDOW:
        for tile in range(tile_begin, tl.minimum(full_lo, tile_end)):
            m_i, l_i, acc = _masked_tile(q, k_ptr, v_ptr, table, tile, kv_len, lo, d_mask, kv_head, offs_n, offs_d,
                                         stride_kb, stride_ks, stride_kh, scale_log2, softcap, m_i, l_i, acc,
                                         BLOCK_N, BLOCK_SIZE, HAS_SOFTCAP, PRECISION)
    for tile in range(full_lo, full_hi):
        k, v = _load_kv_full(k_ptr, v_ptr, table, tile, d_mask, kv_head, offs_n, offs_d, stride_kb, stride_ks,
                             stride_kh, BLOCK_N, BLOCK_SIZE, HEAD_DIM, D_PAD, I64)
        if HAS_SOFTCAP:
            s = _scores(q, k.to(dtype), scale_log2, softcap, HAS_SOFTCAP, PRECISION)
            m_i, l_i, acc = _lazy_softmax_step(s, v.to(dtype), m_i, l_i, acc, 1.0, PRECISION)
        else:  # the scale goes into the exponent's multiply-add
            s = tl.dot(q, tl.trans(k.to(dtype)), input_precision=PRECISION)
            m_i, l_i, acc = _lazy_softmax_step(s, v.to(dtype), m_i, l_i, acc, scale_log2, PRECISION)
    for tile in range(tl.maximum(full_hi, tile_begin), tile_end):
        m_i, l_i, acc = _masked_tile(q, k_ptr, v_ptr, table, tile, kv_len, lo, d_mask, kv_head, offs_n, offs_d,
                                     stride_kb, stride_ks, stride_kh, scale_log2, softcap, m_i, l_i, acc,
                                     BLOCK_N, BLOCK_SIZE, HAS_SOFTCAP, PRECISION)

    if FUSED_QKV:
        if split == num_splits - 1:  # the new token: its k and v into the pool, and one more key for the softmax
            num_q_heads = num_kv_heads * GROUP
            k_new = to_pool(_norm_rope(row + (num_q_heads + kv_head) * HEAD_DIM, k_w_ptr, cos_ptr, cos_ptr + ROT_DIM,
                                       eps, 1, HEAD_DIM, 1, D_PAD, ROT_DIM, HAS_NORM, HAS_ROPE, False, 0.0), k_ptr)
            v_new = to_pool(tl.load(row + (num_q_heads + num_kv_heads + kv_head) * HEAD_DIM + offs_d[None, :],
                                    mask=d_mask[None, :], other=0.0), v_ptr)
            slot = tl.load(slot_ptr + seq).to(tl.int64)
            if slot >= 0:
                off = (slot // BLOCK_SIZE) * stride_kb + (slot % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
                tl.store(k_ptr + off + offs_d[None, :], k_new, mask=d_mask[None, :])
                tl.store(v_ptr + off + offs_d[None, :], v_new, mask=d_mask[None, :])
            s = _cap(tl.sum(q.to(tl.float32) * k_new.to(dtype).to(tl.float32), axis=1), scale_log2, softcap,
                     HAS_SOFTCAP)
            m_new = tl.maximum(m_i, s)
            p = tl.math.exp2(s - m_new)
            alpha = tl.math.exp2(m_i - m_new)
            acc = acc * alpha[:, None] + p.to(dtype).to(tl.float32)[:, None] * v_new.to(dtype).to(tl.float32)
            l_i = l_i * alpha + p
            m_i = m_new

    if IS_SPLIT:  # partial results [B, Hq, NUM_SPLITS_PAD, D_PAD] and (m, l) pairs; empty splits store m=-inf
        part = (seq * (num_kv_heads * GROUP) + heads) * NUM_SPLITS_PAD + split
        tl.store(part_acc_ptr + part[:, None] * D_PAD + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=g_mask)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptr = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=qo_mask)


@triton.jit
def _decode_merge_kernel(part_acc_ptr, part_ml_ptr, out_ptr, num_splits, stride_ot, stride_oh,
                         HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, NUM_SPLITS_PAD: tl.constexpr,
                         USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS_PAD
    offs_s = tl.arange(0, NUM_SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = offs_s < num_splits
    m = tl.load(part_ml_ptr + (part + offs_s) * 2, mask=s_mask, other=float("-inf"))
    l = tl.load(part_ml_ptr + (part + offs_s) * 2 + 1, mask=s_mask, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_max))
    acc = tl.load(part_acc_ptr + (part + offs_s)[:, None] * D_PAD + offs_d[None, :], mask=s_mask[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


@triton.jit
def _prefill_tile(q, k_ptr, v_ptr, table, start, q_pos, seq_len, lo, window, m_i, l_i, acc, offs_n, offs_d, d_mask,
                  kv_head, scale_log2, softcap, stride_kb, stride_ks, stride_kh,
                  BLOCK_SIZE: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    pos = start + offs_n
    n_mask = pos < seq_len
    if HAS_WINDOW:
        n_mask &= pos >= lo
    k, v = _load_kv(k_ptr, v_ptr, table, pos, n_mask, d_mask, kv_head, offs_d, stride_kb, stride_ks, stride_kh,
                    BLOCK_SIZE)
    s = _scores(q, k.to(q.dtype), scale_log2, softcap, HAS_SOFTCAP, PRECISION)
    visible = n_mask[None, :]
    if CAUSAL:
        visible &= pos[None, :] <= q_pos[:, None]
    if HAS_WINDOW:
        visible &= pos[None, :] > q_pos[:, None] - window
    s = tl.where(visible, s, float("-inf"))
    return _online_softmax_step(s, v.to(q.dtype), m_i, l_i, acc, PRECISION)


@triton.jit(do_not_specialize=["stride_bt", "skip_from", "num_seqs"],
            do_not_specialize_on_alignment=["table_ptr", "seq_lens_ptr", "query_start_ptr"])
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, seq_lens_ptr, query_start_ptr,
    scale_log2, softcap, window, skip_from, num_seqs,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, PACK: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, USE_PDL: tl.constexpr,
    FLAT: tl.constexpr = False, SEQS_PAD: tl.constexpr = 1,
):
    """One program per (tile of BLOCK_Q queries, sequence, head group): PACK query heads (1, or GROUP padded to a
    power of two: every head of one kv head) x BLOCK_Q queries as the rows of one tile, so each key tile is loaded
    once for the heads that share it. FLAT: program_id(0) numbers the step's query tiles, sequence after sequence
    (a captured step's grid, sized by its token count, not by its slots times its longest sequence's tiles); each
    program finds its sequence from the query starts of num_seqs (<= SEQS_PAD) sequences."""
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    if FLAT:
        p = tl.program_id(0)
        offs_s = tl.arange(0, SEQS_PAD)
        in_step = offs_s < num_seqs
        starts = tl.load(query_start_ptr + offs_s, mask=in_step, other=0)
        ends = tl.load(query_start_ptr + offs_s + 1, mask=in_step, other=0)
        tiles = (ends - starts + BLOCK_Q - 1) // BLOCK_Q
        last = tl.cumsum(tiles, 0)  # one past each sequence's last tile
        seq = tl.sum((last <= p).to(tl.int32), 0)  # the first sequence whose tiles reach past p
        if seq >= num_seqs:
            return
        tile = p - tl.sum(tl.where(offs_s == seq, last - tiles, 0), 0)
        seq = seq.to(tl.int64)
    else:
        tile = tl.program_id(0)
        seq = tl.program_id(1).to(tl.int64)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if tile * BLOCK_Q >= q_len or q_len >= skip_from:  # sequences of skip_from queries or more: flash attention
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_q = seq_len - q_len + tile * BLOCK_Q  # absolute position of the tile's first query
    offs_r = tl.arange(0, BLOCK_Q * PACK)  # row r: head r // BLOCK_Q of the group, query r % BLOCK_Q of the tile
    offs_m = tile * BLOCK_Q + offs_r % BLOCK_Q
    if PACK == 1:
        heads = tl.program_id(2) + offs_r * 0
        kv_head = tl.program_id(2) // GROUP
        m_mask = offs_m < q_len
    else:
        kv_head = tl.program_id(2)
        heads = kv_head * GROUP + offs_r // BLOCK_Q
        m_mask = (offs_m < q_len) & (offs_r // BLOCK_Q < GROUP)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    q_pos = seq_len - q_len + offs_m
    rows = (q_start + offs_m).to(tl.int64)
    io = rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = _dot_operand(tl.load(q_ptr + io, mask=m_mask[:, None] & d_mask[None, :], other=0.0), k_ptr)
    table = table_ptr + seq * stride_bt
    hi = tl.minimum(first_q + BLOCK_Q, seq_len)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_q - window + 1, 0)
    # keys before `diag` are visible to every query of the tile (up to the window); later ones need the causal mask
    diag = tl.maximum((first_q // BLOCK_N) * BLOCK_N, (lo // BLOCK_N) * BLOCK_N)
    m_i = tl.full([BLOCK_Q * PACK], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * PACK], tl.float32)
    acc = tl.zeros([BLOCK_Q * PACK, D_PAD], tl.float32)
    for start in range((lo // BLOCK_N) * BLOCK_N, diag, BLOCK_N):
        m_i, l_i, acc = _prefill_tile(q, k_ptr, v_ptr, table, start, q_pos, seq_len, lo, window, m_i, l_i, acc,
                                      offs_n, offs_d, d_mask, kv_head, scale_log2, softcap,
                                      stride_kb, stride_ks, stride_kh, BLOCK_SIZE, False, HAS_WINDOW,
                                      HAS_SOFTCAP, PRECISION)
    for start in range(diag, hi, BLOCK_N):
        m_i, l_i, acc = _prefill_tile(q, k_ptr, v_ptr, table, start, q_pos, seq_len, lo, window, m_i, l_i, acc,
                                      offs_n, offs_d, d_mask, kv_head, scale_log2, softcap,
                                      stride_kb, stride_ks, stride_kh, BLOCK_SIZE, True, HAS_WINDOW,
                                      HAS_SOFTCAP, PRECISION)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    io = rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + io, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_num_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Splits per sequence so that the decode grid covers the GPU about twice; fixed for a given batch size, so
    a captured graph keeps it."""
    return max(1, min(MAX_SPLITS, 2 * _num_sms(device) // max(1, num_seqs * num_kv_heads)))


def _common(num_heads: int, dtype: torch.dtype, kv_cache: torch.Tensor, scale: float, sliding_window: int | None,
            softcap: float | None) -> tuple[dict, dict]:
    head_dim, num_kv_heads = kv_cache.shape[4], kv_cache.shape[3]
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    args = dict(scale_log2=scale * LOG2E, softcap=float(softcap or 0.0), window=int(sliding_window or 0))
    flags = dict(GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, D_PAD=max(16, triton.next_power_of_2(head_dim)),
                 BLOCK_SIZE=kv_cache.shape[2], HAS_WINDOW=bool(sliding_window), HAS_SOFTCAP=bool(softcap),
                 PRECISION="ieee" if dtype == torch.float32 else "tf32")
    return dict(k=k_cache, v=v_cache, **args), flags


def decode_config(num_seqs: int, num_kv_heads: int, device: torch.device, head_dim_pad: int = 128,
                  sliding_window: int | None = None) -> dict:
    """Launch parameters of the decode kernel for a batch, from sweeps on an H200 (benchmarks/attention.py --sweep):
    - a 3-stage pipeline and the heads of a sequence side by side gave 3% at batch 256 and 12% at batch 64 x 2048
      over 2 stages in sequence order (results/2026-12-03-h200-attention-sweep.*). Split launches (small batches,
      one or two tiles per split) keep v5's 2 stages.
    - One warp per program once there are >= 6 (sequence, kv head) programs per SM: no cross-warp reductions or
      barriers per key tile, and 32-key tiles keep several programs per SM streaming (2026-12-04, qwen3-8b heads,
      us: 256 x 256 67.9 vs 70.9 with 4 warps, 256 x 128 37.9 vs 40.2, 128 x 256 36.1 vs 38.1, 128 x 1024 127.9 vs
      128.2; at 64 sequences, ~4 programs per SM, it lost: 64 x 2048 144 vs 129). Inside a real run it gained more
      than alone: qwen3-8b 256 x 128 -> 256 decode steps 2,660 -> 2,590 ms, qwen3-0.6b +6.7% e2e.
    - Wide tiles with 8 warps at <= 2.5 programs per SM: 32 x 2048 68.5 vs 78.5, 32 x 512 21.4 vs 23.6.
    Those tiles are for head dims up to 128 (a 256-wide head's accumulator and tiles would not fit them).
    - Wider heads (Gemma 4's 256 and 512; gemma4-default heads, 2026-12-04, us): at 64 x 256, 256-wide 64 keys x 8
      warps x 3 stages 21.6 vs 27.4 with 4 warps, 512-wide 32 keys x 4 warps x 3 stages 39.4 vs 49.5 with 64 keys;
      split launches at batch 1, 16 splits: 32 keys x 4 warps 5.1 / 18.9 us at contexts 256 / 4096 (256-wide),
      6.5 / 26.7 (512-wide), against 64 keys x 8 warps 6.0 / 15.9 and 8.2 / 23.5: the narrow tile where a window
      bounds the keys (Gemma 4's sliding layers), the wide one for layers whose context grows."""
    on_gpu = device.type == "cuda"
    num_splits = decode_num_splits(num_seqs, num_kv_heads, device)
    cfg = dict(num_splits=num_splits, BLOCK_N=64 if on_gpu else 16, num_warps=4,
               num_stages=(3 if num_splits == 1 else 2) if on_gpu else 1, HEADS_FIRST=on_gpu)
    if not on_gpu:
        return cfg
    wide = head_dim_pad > 128
    if num_splits > 1:
        if wide and sliding_window and sliding_window <= 1024:
            cfg.update(BLOCK_N=32)
        elif wide:
            cfg.update(num_warps=8)
        return cfg
    per_sm = num_seqs * num_kv_heads / _num_sms(device)
    if wide and head_dim_pad == 256:
        cfg.update(num_warps=8)
    elif wide:
        cfg.update(BLOCK_N=32)
    elif per_sm >= 6:
        cfg.update(BLOCK_N=32, num_warps=1, num_stages=2)
    elif per_sm <= 2.5:
        cfg.update(BLOCK_N=128, num_warps=8, num_stages=3)
    if DECODE_TILE:
        cfg.update(DECODE_TILE)
    return cfg


_fitted: dict[tuple, dict] = {}  # a launch's (kernel, device, constexprs, tile) -> the tile that fit its GPU


def _launch_fitting(key: tuple, cfg: dict, launch) -> None:
    """launch(cfg): one kernel launch with these tile constexprs. Where the compiled kernel needs more shared memory
    than this GPU's SMs have (OutOfResources, raised as the kernel loads, before it runs: the tiles were tuned for
    2-byte KV in an H200's 227 KiB; a float32 pool at 512-wide heads asked an H100 for 292 KiB, a consumer GPU has
    99), the same with a smaller tile: half the keys (BLOCK_N, down to 16), then one pipeline stage fewer (down to
    1), then (prefill) half the queries of a tile (down to 16 rows). CUDA graphs capture after an eager warm-up, so
    a graphed launch finds its tile here. The tile that fit is kept for the same launch; until a GPU has refused
    one, launches take their tile without that lookup."""
    refused = None
    if not _fitted:
        try:
            return launch(cfg)
        except OutOfResources as e:
            refused = e
    key = key + tuple(sorted(cfg.items()))
    cfg = dict(_fitted.get(key, cfg))
    while True:
        if refused is not None:  # the next smaller tile
            if cfg["BLOCK_N"] > 16:
                cfg["BLOCK_N"] //= 2
            elif cfg.get("num_stages", 1) > 1:
                cfg["num_stages"] -= 1
            elif cfg.get("BLOCK_Q", 0) * cfg.get("PACK", 1) > 16:
                cfg["BLOCK_Q"] //= 2
            else:
                raise refused
        try:
            launch(cfg)
        except OutOfResources as e:
            refused = e
            continue
        _fitted[key] = cfg
        return


def _needs_i64(cache: torch.Tensor) -> bool:
    """Whether an element offset into the cache (one of K or V) can pass 2**31: its span, from the strides."""
    return sum((n - 1) * st for n, st in zip(cache.shape, cache.stride())) >= 2**31 - 1


def _decode(q, kv_cache, meta: AttentionMetadata, out, scale, sliding_window, softcap, config: dict | None = None,
            fused: dict | None = None) -> None:
    """q: [T, Hq, D], or with `fused` (qkv_attention's arguments) the qkv projection's output [T, (Hq + 2 Hkv) D]."""
    num_seqs, num_heads = meta.num_seqs, out.shape[1]
    num_kv_heads = kv_cache.shape[3]
    c, flags = _common(num_heads, q.dtype, kv_cache, scale, sliding_window, softcap)
    cfg = dict(config or decode_config(num_seqs, num_kv_heads, q.device, flags["D_PAD"], sliding_window))
    num_splits = cfg.pop("num_splits")
    is_split = num_splits > 1
    if is_split:
        part_acc = torch.empty(num_seqs, num_heads, MAX_SPLITS, flags["D_PAD"], dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_seqs, num_heads, MAX_SPLITS, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused
    f = fused or {}
    cos_sin, q_w = f.get("cos_sin"), f.get("q_norm_weight")
    bt = meta.block_tables
    grid = (num_kv_heads, num_seqs, num_splits) if cfg["HEADS_FIRST"] else (num_seqs, num_kv_heads, num_splits)
    consts = dict(GROUP_PAD=max(16, triton.next_power_of_2(flags["GROUP"])), NUM_SPLITS_PAD=MAX_SPLITS,
                  IS_SPLIT=is_split, FUSED_QKV=fused is not None, HAS_NORM=q_w is not None, I64=_needs_i64(c["k"]),
                  HAS_ROPE=cos_sin is not None, ROT_DIM=f.get("rot_dim", 0) if cos_sin is not None else 0, **flags)
    _launch_fitting(("decode", q.device, q.dtype, kv_cache.dtype, *sorted(consts.items())), cfg, lambda tile: (
        _decode_kernel[grid](
            q, c["k"], c["v"], bt, meta.seq_lens, out, part_acc, part_ml,
            f["positions"] if cos_sin is not None else q, meta.slot_mapping, q_w if q_w is not None else q,
            f["k_norm_weight"] if q_w is not None else q, cos_sin if cos_sin is not None else q,
            f.get("norm_eps", 0.0), c["scale_log2"], c["softcap"], c["window"], num_splits,
            q.stride(0), flags["HEAD_DIM"] if fused else q.stride(1), c["k"].stride(0), c["k"].stride(1),
            c["k"].stride(2), bt.stride(0), out.stride(0), out.stride(1), **tile, **consts,
            **pdl.launch_args(q.device))))
    if is_split:
        _decode_merge_kernel[(num_seqs, num_heads)](
            part_acc, part_ml, out, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=flags["HEAD_DIM"], D_PAD=flags["D_PAD"], NUM_SPLITS_PAD=MAX_SPLITS, num_warps=4,
            **pdl.launch_args(q.device),
        )


def prefill_config(head_dim_pad: int, max_query_len: int, device: torch.device) -> dict:
    """From a sweep on an H200 (benchmarks/attention.py --sweep, qwen3-8b heads): short prompts want small tiles
    (64 x 128-token prompts: 89 us against 135 us for 128 x 64 tiles), long ones wide key tiles (8k: 1,665 vs
    1,805 us). BLOCK_M is the rows of a tile; PACK_GQA fills them with every query head of a kv head."""
    pack = dict(PACK_GQA=PREFILL_PACK_GQA)
    if device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, **pack)
    if head_dim_pad > 128:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=3, **pack)
    if max_query_len <= 512:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=4, **pack)
    return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, **pack)


def _flash_ok(q: torch.Tensor, kv_cache: torch.Tensor, sliding_window, softcap) -> bool:
    if FLASH_PREFILL_MIN_QUERY <= 0 or sliding_window or softcap or kv_cache.dtype not in (q.dtype, *FP8):
        return False
    if q.device.type != "cuda":  # the interpreter tests: SDPA's math path stands in for the flash kernel
        return True
    return (q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
            and torch.backends.cuda.flash_sdp_enabled() and torch.cuda.get_device_capability(q.device)[0] >= 8)


def _flash_prefill(q, kv_cache, meta: AttentionMetadata, out, seq: int, scale: float) -> None:
    """One sequence's queries by SDPA (flash on a GPU) over its keys gathered from the pool: causal aligned to
    the bottom right, so a chunk after cached context sees all of it."""
    qsl = meta.query_start_loc_cpu
    s, e, seq_len = qsl[seq], qsl[seq + 1], meta.seq_lens_cpu[seq]
    blocks = meta.block_tables[seq, : -(-seq_len // kv_cache.shape[2])]
    k, v = (gather_blocks(kv_cache[i], blocks)[:seq_len].to(q.dtype).transpose(0, 1)[None] for i in (0, 1))
    mask = causal_lower_right(e - s, seq_len) if e - s != seq_len else None
    o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1)[None], k, v, attn_mask=mask, is_causal=mask is None,
                                       scale=scale, enable_gqa=True)
    out[s:e] = o[0].transpose(0, 1)


def _prefill(q, kv_cache, meta: AttentionMetadata, out, scale, sliding_window, softcap,
             config: dict | None = None, flash: bool = True) -> None:
    """flash=False: every sequence in the prefill kernel (benchmarks time the kernel alone)."""
    qsl, max_query_len = meta.query_start_loc_cpu, meta.max_query_len
    long = []
    if (flash and not meta.captured and max_query_len >= FLASH_PREFILL_MIN_QUERY
            and _flash_ok(q, kv_cache, sliding_window, softcap)):
        lens = [qsl[i + 1] - qsl[i] for i in range(meta.num_seqs)]
        long = [i for i, n in enumerate(lens) if n >= FLASH_PREFILL_MIN_QUERY]
        max_query_len = max((n for n in lens if n < FLASH_PREFILL_MIN_QUERY), default=0)
    for i in long:
        _flash_prefill(q, kv_cache, meta, out, i, scale)
    if max_query_len == 0:
        return
    c, flags = _common(q.shape[1], q.dtype, kv_cache, scale, sliding_window, softcap)
    cfg = dict(config or prefill_config(flags["D_PAD"], max_query_len, q.device))
    # rows of a tile: BLOCK_M queries of one head, or BLOCK_M / PACK queries of each of PACK heads sharing a kv head
    pack = triton.next_power_of_2(flags["GROUP"]) if cfg.pop("PACK_GQA", False) and flags["GROUP"] > 1 else 1
    block_q = max(1, cfg.pop("BLOCK_M") // pack)
    bt = meta.block_tables
    heads = q.shape[1] if pack == 1 else kv_cache.shape[3]
    num_seqs = meta.num_seqs
    # a captured step: every query tile of the step (each sequence adds at most one partial tile) in one grid axis
    flat = dict(FLAT=True, SEQS_PAD=triton.next_power_of_2(num_seqs)) if meta.captured else {}

    def grid(tile: dict) -> tuple[int, int, int]:
        if flat:
            return q.shape[0] // tile["BLOCK_Q"] + num_seqs, 1, heads
        return triton.cdiv(max_query_len, tile["BLOCK_Q"]), num_seqs, heads

    _launch_fitting(("prefill", q.device, q.dtype, kv_cache.dtype, *sorted(flags.items()), bool(flat)),
                    dict(cfg, BLOCK_Q=block_q, PACK=pack), lambda tile: _prefill_kernel[grid(tile)](
        q, c["k"], c["v"], out, bt, meta.seq_lens, meta.query_start_loc,
        c["scale_log2"], c["softcap"], c["window"], FLASH_PREFILL_MIN_QUERY if long else 2**31 - 1, num_seqs,
        q.stride(0), q.stride(1), c["k"].stride(0), c["k"].stride(1), c["k"].stride(2), bt.stride(0),
        out.stride(0), out.stride(1), **tile, **flags, **flat, **pdl.launch_args(q.device)))


def _decode_prefix(meta: AttentionMetadata) -> tuple[AttentionMetadata, AttentionMetadata] | None:
    """A mixed step's leading one-token sequences (the scheduler lists running sequences before new prompts) as
    their own decode batch, and the rest; None when there are fewer than MIXED_DECODE_MIN_SEQS of them. Built once
    per step: every layer of a KV group shares the metadata."""
    if meta.captured:  # its host lists give only the grid's shape
        return None
    if "decode_prefix" not in meta.derived:
        qsl, n = meta.query_start_loc_cpu, 0
        while n < meta.num_seqs and qsl[n + 1] - qsl[n] == 1:
            n += 1
        parts = None
        if MIXED_DECODE_MIN_SEQS <= n < meta.num_seqs:
            decode = AttentionMetadata(
                slot_mapping=meta.slot_mapping[:n], query_start_loc=meta.query_start_loc[:n + 1],
                seq_lens=meta.seq_lens[:n], block_tables=meta.block_tables[:n], max_query_len=1,
                max_seq_len=max(meta.seq_lens_cpu[:n]), query_start_loc_cpu=qsl[:n + 1],
                seq_lens_cpu=meta.seq_lens_cpu[:n])
            rest = AttentionMetadata(  # query_start_loc keeps absolute rows: the kernel indexes q and out by them
                slot_mapping=meta.slot_mapping[qsl[n]:], query_start_loc=meta.query_start_loc[n:],
                seq_lens=meta.seq_lens[n:], block_tables=meta.block_tables[n:], max_query_len=meta.max_query_len,
                max_seq_len=meta.max_seq_len, query_start_loc_cpu=qsl[n:], seq_lens_cpu=meta.seq_lens_cpu[n:])
            parts = (decode, rest)
        meta.derived["decode_prefix"] = parts
    return meta.derived["decode_prefix"]


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q: [T, Hq, D] (rows may be strided) -> [T, Hq, D]; KV of this step must already be in kv_cache."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if meta.is_decode_only:
        if out.shape[0] > meta.num_seqs:  # padded tokens produce zeros, as in the reference
            out[meta.num_seqs:].zero_()
        _decode(q, kv_cache, meta, out, scale, sliding_window, softcap)
    elif (parts := _decode_prefix(meta)) is not None:
        decode, rest = parts
        n = decode.num_seqs
        _decode(q[:n], kv_cache, decode, out[:n], scale, sliding_window, softcap)
        _prefill(q, kv_cache, rest, out, scale, sliding_window, softcap)
    else:
        _prefill(q, kv_cache, meta, out, scale, sliding_window, softcap)
    return out


def qkv_attention(qkv: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                  num_heads: int, num_kv_heads: int, q_norm_weight: torch.Tensor | None = None,
                  k_norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
                  cos_sin: torch.Tensor | None = None, rot_dim: int = 0, scale: float = 1.0,
                  sliding_window: int | None = None, softcap: float | None = None, v_norm: bool = False,
                  k_as_v: bool = False, norm_weight_offset: float | None = None) -> torch.Tensor:
    """prepare_qkv then paged_attention (same contract as ember.ops.attention.qkv_attention). A decode step can be one
    kernel (FUSE_MAX_PROGRAMS_PER_SM, off by default; Llama-style norms only, not Gemma 4's variants): each
    program norms and rotates its own heads, and the new token's KV is written from the registers that attend to
    it. qkv is scratch: the unfused path writes the rotated q into it."""
    num_tokens, head_dim = qkv.shape[0], kv_cache.shape[-1]
    fuse = (meta.is_decode_only and num_tokens == meta.num_seqs and qkv.stride(-1) == 1 and num_kv_heads > 0
            and not v_norm and not k_as_v and norm_weight_offset is None
            and meta.num_seqs * num_kv_heads <= FUSE_MAX_PROGRAMS_PER_SM * _num_sms(qkv.device))
    if not fuse:
        q = prepare_qkv(qkv, positions, kv_cache, meta.slot_mapping, num_heads, num_kv_heads, q_norm_weight,
                        k_norm_weight, norm_eps, cos_sin, rot_dim, v_norm, k_as_v, norm_weight_offset)
        return paged_attention(q, kv_cache, meta, scale, sliding_window, softcap)
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    fused = dict(positions=positions, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, norm_eps=norm_eps,
                 cos_sin=cos_sin, rot_dim=rot_dim)
    _decode(qkv, kv_cache, meta, out, scale, sliding_window, softcap, fused=fused)
    return out
