"""The step between the qkv projection and attention in one kernel (one or two programs per token, prepare_config):
per-head RMSNorm of q and k, neox rotary on q and k, q written back in place, k and v written into the paged KV
pool (slots < 0 skipped). Gemma 4's variants too: v RMS-normalised without a weight, v taken from k as projected
(no v part), or q alone (a layer reading another layer's KV).

Same contract as ember.ops.attention.prepare_qkv / write_kv. Rotary is computed in float32 from the float32
cos/sin table (the reference rounds cos/sin to the model dtype first), so bf16 results differ by rounding only.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops.triton import pdl
from ember.ops.triton.norm import apply_weight, weight_args
from ember.ops.triton.overrides import env_launch
from ember.ops.triton.pdl import release_dependents, wait_prior

# EMBER_PREPARE_QKV_CONFIG="q_parts,num_warps": the launch for every step (A/B measurements in a real run)
PREPARE_QKV_CONFIG = env_launch("EMBER_PREPARE_QKV_CONFIG", ("q_parts", "num_warps"))


@triton.jit
def to_pool(x, ptr):
    """x as the pool at ptr stores it (ember.ops.attention.to_pool_dtype): fp8 e4m3 saturates at +-448 and rounds
    to nearest even. The rounding is done here in float32, to a multiple of the value's fp8 step (2^(e - 3) in the
    binade 2^e, 2^-9 below 2^-6) by adding and taking away 1.5 * 2^23 steps; the cast then is exact. (Triton's
    interpreter, which the CPU tests run, rounds an fp8 cast up without carrying into the exponent: 0.49 -> 0.25.)"""
    dtype = ptr.dtype.element_ty
    if dtype == tl.float8e4nv:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)
        exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        step = ((tl.maximum(exponent - 3, -9) + 127) << 23).to(tl.float32, bitcast=True)
        magic = step * 12582912.0
        x = (x + magic) - magic
    return x.to(dtype)


@triton.jit
def _norm_rope(ptr, w_ptr, cos_ptr, sin_ptr, eps, num_heads,
               HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr, ROT_DIM: tl.constexpr,
               HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, FLOAT_WEIGHT: tl.constexpr,
               W_OFFSET: tl.constexpr):
    # [num_heads, HEAD_DIM] row-major at ptr -> float32 [H_PAD, D_PAD], normalised (rounded as ember.ops.norm with
    # weight_offset, apply_weight) and rotated
    dtype = ptr.dtype.element_ty
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    mask = (offs_h < num_heads)[:, None] & d_mask[None, :]
    x = tl.load(ptr + offs_h[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
        w = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        x = apply_weight(x * rstd[:, None], w[None, :], dtype, FLOAT_WEIGHT, W_OFFSET).to(tl.float32)
    if HAS_ROPE:
        half: tl.constexpr = ROT_DIM // 2
        rot = offs_d < ROT_DIM
        # rotate_half(x)[i] = -x[i + half] for i < half, x[i - half] for half <= i < rot_dim
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        pmask = (offs_h < num_heads)[:, None] & rot[None, :]
        xp = tl.load(ptr + offs_h[:, None] * HEAD_DIM + partner[None, :], mask=pmask, other=0.0).to(tl.float32)
        if HAS_NORM:
            wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
            xp = apply_weight(xp * rstd[:, None], wp[None, :], dtype, FLOAT_WEIGHT, W_OFFSET).to(tl.float32)
        cos = tl.load(cos_ptr + offs_d, mask=rot, other=1.0)
        sin = tl.load(sin_ptr + offs_d, mask=rot, other=0.0)
        sign = tl.where(offs_d < half, -1.0, 1.0)
        x = tl.where(rot[None, :], x * cos[None, :] + sign[None, :] * xp * sin[None, :], x)
    return x


@triton.jit
def _prepare_qkv_kernel(
    qkv_ptr, positions_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, q_w_ptr, k_w_ptr, cos_sin_ptr,
    eps, stride_t, stride_slot, num_heads, num_kv_heads,
    HEAD_DIM: tl.constexpr, HQ_PAD: tl.constexpr, HKV_PAD: tl.constexpr, D_PAD: tl.constexpr,
    ROT_DIM: tl.constexpr, HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, DO_QK: tl.constexpr,
    HAS_KV: tl.constexpr, V_NORM: tl.constexpr, K_AS_V: tl.constexpr,
    FLOAT_WEIGHT: tl.constexpr, W_OFFSET: tl.constexpr,
    Q_PARTS: tl.constexpr, KV_PART: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Grid (tokens, parts): parts 0..Q_PARTS-1 each take num_heads / Q_PARTS query heads, part KV_PART the keys
    and values (KV_PART = 0 with Q_PARTS = 1: one program per token does everything). HAS_KV off: q alone.
    V_NORM: v RMS-normalised without a weight; K_AS_V: the row holds no v part and v is k as projected."""
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    row = qkv_ptr + t * stride_t
    k_row = row + num_heads * HEAD_DIM
    v_row = k_row if K_AS_V else k_row + num_kv_heads * HEAD_DIM
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    cos_ptr = cos_sin_ptr
    if HAS_ROPE:
        cos_ptr = cos_sin_ptr + tl.load(positions_ptr + t).to(tl.int64) * (2 * ROT_DIM)
    if DO_QK:
        if part < Q_PARTS:
            part_heads = num_heads // Q_PARTS
            q_row = row + part * part_heads * HEAD_DIM
            q = _norm_rope(q_row, q_w_ptr, cos_ptr, cos_ptr + ROT_DIM, eps, part_heads,
                           HEAD_DIM, HQ_PAD, D_PAD, ROT_DIM, HAS_NORM, HAS_ROPE, FLOAT_WEIGHT, W_OFFSET)
            offs_hq = tl.arange(0, HQ_PAD)
            q_mask = (offs_hq < part_heads)[:, None] & d_mask[None, :]
            tl.store(q_row + offs_hq[:, None] * HEAD_DIM + offs_d[None, :], q.to(row.dtype.element_ty), mask=q_mask)
    if HAS_KV and part == KV_PART:
        offs_hk = tl.arange(0, HKV_PAD)
        kv_mask = (offs_hk < num_kv_heads)[:, None] & d_mask[None, :]
        kv_offs = offs_hk[:, None] * HEAD_DIM + offs_d[None, :]
        if DO_QK:
            k = _norm_rope(k_row, k_w_ptr, cos_ptr, cos_ptr + ROT_DIM, eps, num_kv_heads,
                           HEAD_DIM, HKV_PAD, D_PAD, ROT_DIM, HAS_NORM, HAS_ROPE, FLOAT_WEIGHT, W_OFFSET)
        else:
            k = tl.load(k_row + kv_offs, mask=kv_mask, other=0.0)
        v = tl.load(v_row + kv_offs, mask=kv_mask, other=0.0)
        if V_NORM:
            vf = v.to(tl.float32)
            v = vf * (1.0 / tl.sqrt(tl.sum(vf * vf, axis=1) / HEAD_DIM + eps))[:, None]
            v = v.to(row.dtype.element_ty)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            tl.store(k_cache_ptr + slot * stride_slot + kv_offs, to_pool(k, k_cache_ptr), mask=kv_mask)
            tl.store(v_cache_ptr + slot * stride_slot + kv_offs, to_pool(v, v_cache_ptr), mask=kv_mask)


def prepare_config(num_tokens: int) -> dict:
    """q_parts: programs per token for the query heads (0: one program per token does q, k and v); num_warps.

    At decode rows the kernel is a few dependent loads long (position, cos/sin, the rows): timed after the qkv
    GEMM in a graph (benchmarks/small_kernels.py, qwen3-8b heads, 2026-12-04), the query heads in one 8-warp
    program and the keys and values in another took 3.24 / 3.77 us at 128 / 256 rows, against 4.00 / 4.71 for one
    4-warp program per token (the best of 20 launches at each size was within ~0.5 us of it; 1-warp programs took
    6.4-7.3). End to end at qwen3-8b 256 x 128 -> 256 the ~1 us per layer is within the run-to-run spread.
    Prefill-sized launches keep one program per token (not measured split)."""
    if PREPARE_QKV_CONFIG is not None:
        return dict(PREPARE_QKV_CONFIG)
    if num_tokens <= 512:
        return dict(q_parts=1, num_warps=8)
    return dict(q_parts=0, num_warps=4)


def _launch(qkv: torch.Tensor, positions, kv_cache, slot_mapping, num_heads, num_kv_heads, q_w, k_w, eps,
            cos_sin, rot_dim, do_qk: bool, config: dict | None = None, v_norm: bool = False,
            k_as_v: bool = False, weight_offset: float | None = None) -> None:
    num_tokens = qkv.shape[0]
    head_dim = kv_cache.shape[-1]
    assert kv_cache[0].is_contiguous() and qkv.stride(-1) == 1
    has_norm, has_rope = q_w is not None, cos_sin is not None
    # q and k share the norm flag: both normed (Qwen3, Gemma 4) or neither; a q-only launch has no k
    assert not num_kv_heads or (k_w is not None) == has_norm, "q and k norm weights come together"
    dummy = qkv  # never read when the matching flag is off
    if num_tokens == 0:
        return
    cfg = dict(config or prepare_config(num_tokens))
    q_parts = cfg.pop("q_parts") if do_qk else 0
    if q_parts and num_heads % q_parts:
        q_parts = 0
    has_kv = num_kv_heads > 0
    grid = (num_tokens, (q_parts + has_kv) if q_parts else 1)
    _prepare_qkv_kernel[grid](
        qkv, positions if has_rope else dummy, slot_mapping, kv_cache[0], kv_cache[1],
        q_w if has_norm else dummy, k_w if has_norm else dummy, cos_sin if has_rope else dummy,
        eps, qkv.stride(0), kv_cache.stride(2), num_heads, num_kv_heads,
        HEAD_DIM=head_dim, HQ_PAD=triton.next_power_of_2(max(1, num_heads // max(1, q_parts))),
        HKV_PAD=triton.next_power_of_2(num_kv_heads), D_PAD=triton.next_power_of_2(head_dim),
        ROT_DIM=rot_dim if has_rope else 0, HAS_NORM=has_norm, HAS_ROPE=has_rope, DO_QK=do_qk,
        HAS_KV=has_kv, V_NORM=v_norm, K_AS_V=k_as_v, **weight_args(weight_offset),
        Q_PARTS=max(1, q_parts), KV_PART=q_parts,
        num_warps=cfg.pop("num_warps"), **pdl.launch_args(qkv.device),
    )


def prepare_qkv(qkv: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                num_heads: int, num_kv_heads: int, q_norm_weight: torch.Tensor | None = None,
                k_norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
                cos_sin: torch.Tensor | None = None, rot_dim: int = 0, v_norm: bool = False, k_as_v: bool = False,
                norm_weight_offset: float | None = None, config: dict | None = None) -> torch.Tensor:
    head_dim = kv_cache.shape[-1]
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    _launch(qkv, positions, kv_cache, slot_mapping, num_heads, num_kv_heads, q_norm_weight, k_norm_weight,
            norm_eps, cos_sin, rot_dim, do_qk=True, config=config, v_norm=v_norm, k_as_v=k_as_v,
            weight_offset=norm_weight_offset)
    # q was rewritten in place: a strided view of the qkv rows
    return qkv[:, : num_heads * head_dim].view(qkv.shape[0], num_heads, head_dim)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    qkv = torch.cat([k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1)], dim=-1)
    _launch(qkv, None, kv_cache, slot_mapping, 0, num_kv_heads, None, None, 0.0, None, 0, do_qk=False)
