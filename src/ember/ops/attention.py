"""Reference (torch) paged attention over a block pool; the CPU path and the oracle for GPU kernels.

KV pool layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (k then v).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.ops.norm import rms, rms_norm
from ember.ops.rotary import apply_rotary
from ember.worker.attn_metadata import AttentionMetadata


def to_pool_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as the pool stores it: an fp8 pool (config.KV_CACHE_DTYPES) saturates at its largest finite value, where a
    plain cast would overflow to NaN; the kernels' stores do the same (ember.ops.triton.qkv)."""
    if dtype.itemsize != 1:
        return x.to(dtype)
    fmax = torch.finfo(dtype).max
    return x.float().clamp(-fmax, fmax).to(dtype)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    # k, v: [T, Hkv, D]; slots < 0 are padding and are skipped
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if (slot_mapping < 0).any():
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k, v = to_pool_dtype(k, kv_cache.dtype), to_pool_dtype(v, kv_cache.dtype)
    if kv_cache.dtype.itemsize == 1:  # index_copy_ has no fp8 kernels on CPU: copy the bytes
        kv_cache, k, v = kv_cache.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


def prepare_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    cos_sin: torch.Tensor | None = None,
    rot_dim: int = 0,
    v_norm: bool = False,
    k_as_v: bool = False,
    norm_weight_offset: float | None = None,
) -> torch.Tensor:
    """The step between the qkv projection and attention: optional per-head RMSNorm of q and k (norm_weight_offset:
    ember.ops.norm's weight_offset), rotary on q and k (when cos_sin is given), and the KV write into the pool.
    qkv: [T, (Hq + 2 Hkv) * D] -> q [T, Hq, D].

    Gemma 4's variants: v_norm RMS-normalises v without a weight (norm_eps); k_as_v: qkv holds no v part
    ([T, (Hq + Hkv) * D]) and v is k as projected, before its norm and rotary; num_kv_heads=0: qkv is q alone
    (a layer reading another layer's KV) and nothing is written."""
    num_tokens, head_dim = qkv.shape[0], kv_cache.shape[-1]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
    if q_norm_weight is not None:
        q = rms_norm(q, q_norm_weight, norm_eps, norm_weight_offset)
    if not num_kv_heads:
        return apply_rotary(positions, q, q[:, :1], cos_sin, rot_dim)[0] if cos_sin is not None else q
    k = qkv[:, q_size:q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    v = k if k_as_v else qkv[:, q_size + kv_size:q_size + 2 * kv_size].view(num_tokens, num_kv_heads, head_dim)
    if k_norm_weight is not None:
        k = rms_norm(k, k_norm_weight, norm_eps, norm_weight_offset)
    if v_norm:
        v = rms(v, norm_eps)
    if cos_sin is not None:
        q, k = apply_rotary(positions, q, k, cos_sin, rot_dim)
    write_kv(kv_cache, k, v, slot_mapping)
    return q


def qkv_attention(qkv: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                  num_heads: int, num_kv_heads: int, q_norm_weight: torch.Tensor | None = None,
                  k_norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
                  cos_sin: torch.Tensor | None = None, rot_dim: int = 0, scale: float = 1.0,
                  sliding_window: int | None = None, softcap: float | None = None, v_norm: bool = False,
                  k_as_v: bool = False, norm_weight_offset: float | None = None) -> torch.Tensor:
    """Everything from the qkv projection's output to the attention output: prepare_qkv (norms, rotary, KV write)
    then paged_attention. qkv: [T, (Hq + 2 Hkv) * D] -> [T, Hq, D]. One op so a GPU decode step can fuse it."""
    q = prepare_qkv(qkv, positions, kv_cache, meta.slot_mapping, num_heads, num_kv_heads, q_norm_weight,
                    k_norm_weight, norm_eps, cos_sin, rot_dim, v_norm, k_as_v, norm_weight_offset)
    return paged_attention(q, kv_cache, meta, scale, sliding_window, softcap)


def _softcap_scores(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return scores if not softcap else softcap * torch.tanh(scores / softcap)


def _sdpa(q, k, v, mask, scale: float, softcap: float | None) -> torch.Tensor:
    # q: [N, Hkv, Mq, D]  k, v: [N, Hkv, L, D]  mask: bool, broadcastable to [N, Hkv, Mq, L]
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = _softcap_scores(torch.matmul(q, k.transpose(-1, -2)).float() * scale, softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1).to(v.dtype), v)


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    # cache [num_blocks, bs, Hkv, D], block_ids [..., nb] -> [..., nb*bs, Hkv, D]
    # index_select on flat ids is several times faster than advanced indexing on CPU
    g = cache.index_select(0, block_ids.reshape(-1))
    return g.view(*block_ids.shape[:-1], block_ids.shape[-1] * cache.shape[1], *cache.shape[2:])


def _decode_inputs(meta: AttentionMetadata, block_size: int, window: int | None, device) -> tuple:
    """Flat block ids [B * nb] and key mask [B, 1, 1, L]: the same for every layer of a step, built once."""
    key = ("decode", block_size, window)
    if key not in meta.derived:
        num_seqs = meta.num_seqs
        num_blocks = -(-meta.max_seq_len // block_size)
        blocks = meta.block_tables[:num_seqs, :num_blocks].reshape(-1).long()
        pos = torch.arange(num_blocks * block_size, device=device)
        seq_lens = meta.seq_lens[:num_seqs, None].long()
        mask = pos[None, :] < seq_lens
        if window:
            mask &= pos[None, :] >= seq_lens - window
        meta.derived[key] = (blocks, mask[:, None, None, :])
    return meta.derived[key]


def _decode(q, kv_cache, meta: AttentionMetadata, scale, window, softcap) -> torch.Tensor:
    # One query per sequence: fold the query heads of a KV group into the "query length" axis (no KV repeat).
    num_seqs, (hq, d) = meta.num_seqs, q.shape[1:]
    block_size, hkv = kv_cache.shape[2], kv_cache.shape[3]
    blocks, mask = _decode_inputs(meta, block_size, window, q.device)
    kv = kv_cache.index_select(1, blocks)  # k and v of every block in one gather: [2, B * nb, bs, Hkv, D]
    kv = kv.view(2, num_seqs, -1, hkv, d).transpose(2, 3).to(q.dtype)  # [2, B, Hkv, L, D]
    qg = q[:num_seqs].view(num_seqs, hkv, hq // hkv, d)
    out = _sdpa(qg, kv[0], kv[1], mask, scale, softcap)
    return out.reshape(num_seqs, hq, d)


def _prefill_one(q, kv_cache, block_ids, seq_len, scale, window, softcap) -> torch.Tensor:
    # q: [M, Hq, D] are the last M of seq_len tokens
    m, hq, d = q.shape
    hkv = kv_cache.shape[3]
    k = gather_blocks(kv_cache[0], block_ids)[:seq_len].to(q.dtype)  # [L, Hkv, D]
    v = gather_blocks(kv_cache[1], block_ids)[:seq_len].to(q.dtype)
    q_pos = torch.arange(seq_len - m, seq_len, device=q.device)[:, None]
    k_pos = torch.arange(seq_len, device=q.device)[None, :]
    mask = k_pos <= q_pos
    if window:
        mask &= k_pos > q_pos - window
    group = hq // hkv
    # [Hkv, group*M, D] with the M queries of each head contiguous
    qg = q.permute(1, 0, 2).reshape(hkv, group * m, d)
    out = _sdpa(qg[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask.repeat(group, 1)[None, None], scale, softcap)
    return out[0].reshape(hq, m, d).transpose(0, 1)  # SDPA output may be strided on CUDA


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D] -> [T, Hq, D]; KV of this step must already be written into kv_cache."""
    if meta.is_decode_only:
        out = _decode(q, kv_cache, meta, scale, sliding_window, softcap)
        if out.shape[0] < q.shape[0]:  # padded tokens produce zeros
            out = torch.cat([out, q.new_zeros(q.shape[0] - out.shape[0], *q.shape[1:])])
        return out
    out = torch.empty_like(q)
    block_size = kv_cache.shape[2]
    starts = meta.query_start_loc_cpu
    for i, seq_len in enumerate(meta.seq_lens_cpu):
        s, e = starts[i], starts[i + 1]
        if e == s:
            continue
        block_ids = meta.block_tables[i, : -(-seq_len // block_size)].long()
        out[s:e] = _prefill_one(q[s:e], kv_cache, block_ids, seq_len, scale, sliding_window, softcap)
    return out
