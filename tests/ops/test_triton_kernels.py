"""Triton kernels (ember.ops.triton) against the torch reference ops (ember.ops.*).

On a machine without CUDA they run on CPU tensors in float32 under TRITON_INTERPRET=1 (the interpreter's bf16
matmul is not usable); with CUDA they run compiled, in float32 and bfloat16. Skipped when triton is absent."""
from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
import torch

from tests.ops.kernel_checks import DEVICE, DTYPES, TRITON_MIN_VERSION, assert_close

pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)

from ember.ops import activation as ref_act  # noqa: E402
from ember.ops import attention as ref_attn  # noqa: E402
from ember.ops import gemm as ref_gemm  # noqa: E402
from ember.ops import norm as ref_norm  # noqa: E402
from ember.ops import triton as tri  # noqa: E402
from ember.worker.attn_metadata import AttentionMetadata  # noqa: E402

BLOCK_SIZE = 16


def tol(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 2e-2


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert_close(a, b, tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 96, 1000])
def test_rms_norm_and_fused_add(dtype, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(7, n, generator=g).to(DEVICE, dtype)
    r = torch.randn(7, n, generator=g).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(DEVICE, dtype)
    close(tri.rms_norm(x, w, 1e-6), ref_norm.rms_norm(x, w, 1e-6), dtype)
    for offset in (1.0, 0.0):  # weights stored as (scale - 1); Gemma 4's weight multiplied in float32
        close(tri.rms_norm(x, w, 1e-6, offset), ref_norm.rms_norm(x, w, 1e-6, offset), dtype)
    out, res = tri.add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_res = ref_norm.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(res, ref_res)
    close(out, ref_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("weight_offset", [None, 1.0, 0.0])
def test_rms_norm_then_residual_add(dtype, scale, weight_offset):
    # a sandwich norm's output: residual + norm(x), times Gemma 4's per-layer scale
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 300, generator=g).to(DEVICE, dtype)
    r = torch.randn(5, 300, generator=g).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(300, generator=g)).to(DEVICE, dtype)
    s = torch.tensor([0.7], dtype=dtype, device=DEVICE) if scale else None
    out = tri.rms_norm_add(x, r, w, 1e-6, weight_offset, s)
    ref = ref_norm.rms_norm_add(x, r, w, 1e-6, weight_offset, s)
    close(out, ref, dtype)
    unscaled = r + ref_norm.rms_norm(x, w, 1e-6, weight_offset)
    assert not torch.equal(out, r) and (not scale or not torch.allclose(out, unscaled))
    # and the next block's input norm of that sum, in the same kernel
    w2 = (1 + 0.1 * torch.randn(300, generator=g)).to(DEVICE, dtype)
    normed, h = tri.rms_norm_add_rms_norm(x, r, w, w2, 1e-6, weight_offset, s)
    ref_normed, ref_h = ref_norm.rms_norm_add_rms_norm(x, r, w, w2, 1e-6, weight_offset, s)
    close(h, ref_h, dtype)
    close(normed, ref_normed, dtype)
    close(h, out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu"])
def test_act_mul_with_a_strided_up(dtype, act):
    # Gemma 4's per-layer input gate: up is one layer's slice of [T, L, P] per-layer inputs
    g = torch.Generator().manual_seed(4)
    gate = torch.randn(6, 200, generator=g).to(DEVICE, dtype)
    up = torch.randn(6, 3, 200, generator=g).to(DEVICE, dtype)[:, 1]
    close(tri.act_mul(gate, up, act), ref_act.act_mul(gate, up, act), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [None, dict(BLOCK=128, ROWS=2, num_warps=4), dict(BLOCK=256, ROWS=4, num_warps=8)])
def test_silu_and_mul(dtype, config):
    # tiles that cover several rows and leave partial ones at both edges (5 rows, 300 columns)
    x = torch.randn(5, 2 * 300, generator=torch.Generator().manual_seed(0)).to(DEVICE, dtype)
    close(tri.silu_and_mul(x, config), ref_act.silu_and_mul(x), dtype)


def _cos_sin(max_pos: int, rot_dim: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
    freqs = torch.arange(max_pos).float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return torch.cat([emb.cos(), emb.sin()], -1).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,rot_dim,norm", [
    (4, 2, 16, 16, True), (6, 2, 24, 24, True), (4, 1, 32, 16, False), (8, 8, 64, 64, False), (4, 2, 32, 0, True),
])
# q_parts: the query heads over that many programs per token and the KV in one more (4 does not divide 6 heads:
# one program per token then does all)
@pytest.mark.parametrize("config", [None, dict(q_parts=1, num_warps=1), dict(q_parts=2, num_warps=2),
                                    dict(q_parts=4, num_warps=4)], ids=["default", "q1", "q2", "q4"])
def test_prepare_qkv(dtype, heads, kv_heads, head_dim, rot_dim, norm, config):
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    num_tokens, num_blocks = 9, 6
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE, dtype)
    positions = torch.randint(0, 200, (num_tokens,), generator=g).to(DEVICE)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:num_tokens].to(DEVICE)
    qw = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(DEVICE, dtype) if norm else None
    kw = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(DEVICE, dtype) if norm else None
    cos_sin = _cos_sin(256, rot_dim) if rot_dim else None
    pools = [torch.full((2, num_blocks, BLOCK_SIZE, kv_heads, head_dim), 7.0, dtype=dtype, device=DEVICE)
             for _ in range(2)]
    args = (heads, kv_heads, qw, kw, 1e-6, cos_sin, rot_dim)
    q_ref = ref_attn.prepare_qkv(qkv.clone(), positions, pools[0], slots, *args)
    q_tri = tri.prepare_qkv(qkv.clone(), positions, pools[1], slots, *args, config=config)
    close(q_tri, q_ref, dtype)
    close(pools[1], pools[0], dtype)
    assert torch.equal(pools[1] == 7.0, pools[0] == 7.0)  # exactly the same slots written


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["v_norm", "k_as_v", "q_only"])
@pytest.mark.parametrize("rot_dim", [32, 8])
@pytest.mark.parametrize("config", [None, dict(q_parts=1, num_warps=2), dict(q_parts=0, num_warps=4)],
                         ids=["default", "q1", "one_program"])
def test_prepare_qkv_gemma4_variants(dtype, variant, rot_dim, config):
    """Gemma 4: v RMS-normalised without a weight; global layers with K = V (no v part: v is k as projected);
    KV-shared layers (q alone, nothing written)."""
    g = torch.Generator().manual_seed(len(variant) + rot_dim)
    heads, kv_heads, head_dim, num_tokens, num_blocks = 4, 2, 32, 7, 5
    kv_parts = {"v_norm": 2, "k_as_v": 1, "q_only": 0}[variant]
    qkv = torch.randn(num_tokens, (heads + kv_parts * kv_heads) * head_dim, generator=g).to(DEVICE, dtype)
    positions = torch.randint(0, 200, (num_tokens,), generator=g).to(DEVICE)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:num_tokens].to(DEVICE)
    qw = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(DEVICE, dtype)
    kw = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(DEVICE, dtype)
    pools = [torch.full((2, num_blocks, BLOCK_SIZE, kv_heads, head_dim), 7.0, dtype=dtype, device=DEVICE)
             for _ in range(2)]
    args = (heads, kv_heads if kv_parts else 0, qw, kw if kv_parts else None, 1e-6, _cos_sin(256, rot_dim), rot_dim,
            True, variant == "k_as_v")
    # Gemma 4's q/k norms multiply by the weight in float32 (ember.ops.norm's weight_offset 0.0)
    q_ref = ref_attn.prepare_qkv(qkv.clone(), positions, pools[0], slots, *args, norm_weight_offset=0.0)
    q_tri = tri.prepare_qkv(qkv.clone(), positions, pools[1], slots, *args, norm_weight_offset=0.0, config=config)
    close(q_tri, q_ref, dtype)
    close(pools[1], pools[0], dtype)
    written = (pools[0] != 7.0).any(-1).any(-1).sum().item()
    assert written == (2 * num_tokens if kv_parts else 0)
    assert torch.equal(pools[1] == 7.0, pools[0] == 7.0)
    if kv_parts:  # the values are unit-RMS rows
        v = pools[0].view(2, -1, kv_heads, head_dim)[1, slots]
        assert torch.allclose(v.float().pow(2).mean(-1), torch.ones(()), atol=tol(dtype) * 10)


def test_write_kv_skips_negative_slots():
    pool = torch.zeros(2, 3, BLOCK_SIZE, 2, 16, device=DEVICE)
    k, v = torch.ones(2, 2, 16, device=DEVICE), 2 * torch.ones(2, 2, 16, device=DEVICE)
    tri.write_kv(pool, k, v, torch.tensor([17, -1], device=DEVICE))
    flat = pool.view(2, -1, 2, 16)
    assert (flat[0, 17] == 1).all() and (flat[1, 17] == 2).all()
    assert flat.count_nonzero() == 2 * 2 * 16


def _batch(query_lens: list[int], context_lens: list[int], heads: int, kv_heads: int, head_dim: int, dtype,
           seed: int, block_size: int = BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A pool filled with random KV, sequences on shuffled blocks, and the metadata of one step."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 1
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables, slots = [], []
    for n, s, q in zip(blocks_per_seq, seq_lens, query_lens):
        own, ids = ids[:n], ids[n:]
        tables.append(own + [0] * (max(blocks_per_seq) + 2 - n))
        slots += [own[p // block_size] * block_size + p % block_size for p in range(s - q, s)]
    pool = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    q = torch.randn(sum(query_lens), heads, head_dim, generator=g).to(DEVICE, dtype)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=DEVICE), query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
    )
    return q, pool, meta


def reference_attention(q, pool, meta: AttentionMetadata, scale, window, softcap) -> torch.Tensor:
    """The torch reference on CPU in float32 (the oracle; CPU is where the reference path runs)."""
    tensors = {f.name: getattr(meta, f.name) for f in fields(meta)}
    cpu = replace(meta, **{k: v.cpu() for k, v in tensors.items() if isinstance(v, torch.Tensor)})
    return ref_attn.paged_attention(q.cpu().float(), pool.cpu().float(), cpu, scale, window, softcap).to(q.device)


ATTN_CASES = [  # heads, kv_heads, head_dim, window, softcap
    (4, 2, 16, None, None), (8, 1, 32, None, None), (6, 6, 24, None, None), (4, 2, 16, 24, None),
    (4, 2, 16, None, 30.0), (4, 2, 64, None, None), (8, 2, 128, None, None),
]


def test_decode_offsets_widen_to_64_bits_by_the_cache_span():
    """The decode kernel's full tiles take 32-bit element offsets unless an offset into K or V (its span, from the
    shape and strides, not its element count) can reach 2**31."""
    from ember.ops.triton.attention import _needs_i64

    assert _needs_i64(torch.empty(2**31, device="meta"))
    assert not _needs_i64(torch.empty(2**31 - 1, device="meta"))
    assert _needs_i64(torch.empty(2, 2**30, device="meta").t())
    assert _needs_i64(torch.empty(2**31 + 1, device="meta")[:: 2**31])  # two elements, 2**31 apart


@pytest.mark.parametrize("block_size,tile", [(8, 32), (32, 16), (64, 32), (16, 64)])
@pytest.mark.parametrize("wide_offsets", [False, True])
@pytest.mark.parametrize("window", [None, 40])
def test_paged_decode_key_tiles_across_block_sizes(block_size, tile, wide_offsets, window, monkeypatch):
    """The decode kernel loads a tile whose keys all lie in the sequence without masks, by the block-table rows of
    the tile (several pool blocks per tile, or several tiles per block), in 32- or 64-bit offsets (the latter for a
    cache of 2**31 elements or more: forced here); a partial tile at either end goes the masked way. Contexts end
    inside, at and past tile and block edges; under a window the first tiles are partial or skipped."""
    from ember.ops.triton import attention as tri_attn

    monkeypatch.setattr(tri_attn, "_needs_i64", lambda cache: wide_offsets)
    heads, kv_heads, head_dim = 4, 2, 32
    context = [0, 7, 15, 16, 31, 32, 33, 63, 64, 100, 129]
    q, pool, meta = _batch([1] * len(context), context, heads, kv_heads, head_dim, torch.float32, 5, block_size)
    ref = reference_attention(q, pool, meta, 0.3, window, None)
    for splits in (1, 3):
        out = torch.empty_like(q)
        config = dict(num_splits=splits, BLOCK_N=tile, num_warps=1, num_stages=1, HEADS_FIRST=True)
        tri_attn._decode(q, pool, meta, out, 0.3, window, None, config)
        close(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 4])
def test_paged_decode_scores_rising_and_falling_across_tiles(dtype, splits):
    """Keys grow then shrink along each sequence, so a row's maximum score climbs by far more than 2^8 from tile
    to tile and then stops climbing: the decode loop rescales its sums only on such jumps (_lazy_softmax_step)
    and otherwise keeps a stale maximum, and either way must give softmax attention."""
    from ember.ops.triton import attention as tri_attn

    heads, kv_heads, head_dim = 8, 2, 32
    context = [40, 97, 160, 255]
    q, pool, meta = _batch([1] * len(context), context, heads, kv_heads, head_dim, dtype, 3)
    gain = torch.ones(pool.shape[1], BLOCK_SIZE)
    for row, n in zip(meta.block_tables.cpu().tolist(), meta.seq_lens.cpu().tolist()):
        for pos in range(n):  # 1x at the start, 6x in the middle of the sequence, back to ~1x at its end
            gain[row[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = 1 + 5 * math.sin(math.pi * pos / n)
    pool[0] *= gain[:, :, None, None].to(pool.device, pool.dtype)
    scale = 0.5
    ref = reference_attention(q, pool, meta, scale, None, None)
    config = dict(num_splits=splits, BLOCK_N=16, num_warps=1, num_stages=1, HEADS_FIRST=True)
    out = torch.empty_like(q)
    tri_attn._decode(q, pool, meta, out, scale, None, None, config)
    close(out, ref, dtype)
    # the test's premise: along the longest sequence, a head's running maximum climbs past 2^8 several times
    keys = pool[0].float().cpu()[meta.block_tables[3].long().cpu()].flatten(0, 1)[:255, 0]  # [keys, dim]
    tile_max = (keys[:240] @ q[3, 0].float().cpu() * scale * math.log2(math.e)).view(15, 16).amax(1)
    assert (tile_max.cummax(0).values.diff() > 8).sum() >= 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,softcap", ATTN_CASES)
@pytest.mark.parametrize("num_seqs", [1, 3, 9])
def test_paged_decode(dtype, heads, kv_heads, head_dim, window, softcap, num_seqs):
    context = [1 + (37 * i + 5) % 90 for i in range(num_seqs)]
    context[0] = 0  # a sequence whose only token is the query
    q, pool, meta = _batch([1] * num_seqs, context, heads, kv_heads, head_dim, dtype, num_seqs + heads)
    scale = head_dim ** -0.5
    ref = reference_attention(q, pool, meta, scale, window, softcap)
    close(tri.paged_attention(q, pool, meta, scale, window, softcap), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [256, 512])
@pytest.mark.parametrize("num_seqs", [1, 40 if DEVICE == "cuda" else 5])  # 40: an unsplit launch on an H200
def test_paged_decode_wide_heads(dtype, head_dim, num_seqs):
    """Gemma 4's 256- and 512-wide heads through the launch decode_config picks for them (on a GPU: by whether
    the launch is split and a window bounds the keys), over contexts past several tiles."""
    context = [3 + (53 * i + 11) % 150 for i in range(num_seqs)]
    q, pool, meta = _batch([1] * num_seqs, context, 8, 4, head_dim, dtype, 11 * num_seqs + 1)
    scale = 1.0
    ref = reference_attention(q, pool, meta, scale, None, None)
    close(tri.paged_attention(q, pool, meta, scale, None, None), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [(32, 1, 2), (128, 8, 3), (64, 4, 3), (16, 1, 2)])
@pytest.mark.parametrize("window", [None, 70])
def test_paged_decode_tuned_tiles(dtype, tile, window):
    """The unsplit launch with each tile decode_config picks on a GPU (one warp at large batches, wide tiles with 8
    warps at small ones) over contexts that end inside, at and just past a tile's edge."""
    from ember.ops.triton import attention as tri_attn

    heads, kv_heads, head_dim = 8, 2, 128
    context = [0, 15, 31, 32, 63, 64, 127, 128, 200]
    q, pool, meta = _batch([1] * len(context), context, heads, kv_heads, head_dim, dtype, 11)
    scale = head_dim ** -0.5
    ref = reference_attention(q, pool, meta, scale, window, None)
    out = torch.empty_like(q)
    config = dict(num_splits=1, BLOCK_N=tile[0], num_warps=tile[1], num_stages=tile[2], HEADS_FIRST=True)
    tri_attn._decode(q, pool, meta, out, scale, window, None, config)
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,softcap", ATTN_CASES[:2] + ATTN_CASES[3:5])
def test_mixed_step_decode_prefix(dtype, heads, kv_heads, head_dim, window, softcap, monkeypatch):
    """A mixed step's leading decodes go to the decode kernel, the rest (a decode among them too) to the prefill
    kernel: the same output as the reference over the whole step."""
    from ember.ops.triton import attention as tri_attn

    monkeypatch.setattr(tri_attn, "MIXED_DECODE_MIN_SEQS", 2)
    query_lens, context = [1, 1, 1, 37, 1, 20, 5], [40, 3, 77, 0, 12, 33, 0]
    q, pool, meta = _batch(query_lens, context, heads, kv_heads, head_dim, dtype, heads + 7)
    assert tri_attn._decode_prefix(meta)[0].num_seqs == 3
    scale = head_dim ** -0.5
    ref = reference_attention(q, pool, meta, scale, window, softcap)
    close(tri.paged_attention(q, pool, meta, scale, window, softcap), ref, dtype)


def _qkv_decode_case(heads, kv_heads, head_dim, rot_dim, norm, num_seqs, dtype, seed):
    """A decode step's qkv rows, positions and weights over _batch's pool (whose new-token slots hold stale KV)."""
    context = [(37 * i + 5) % 90 for i in range(num_seqs)]
    context[0] = 0  # a sequence whose only token is the query
    _, pool, meta = _batch([1] * num_seqs, context, heads, kv_heads, head_dim, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(num_seqs, (heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE, dtype)
    positions = (meta.seq_lens - 1).long()
    weights = [(1 + 0.1 * torch.randn(head_dim, generator=g)).to(DEVICE, dtype) if norm else None for _ in range(2)]
    cos_sin = _cos_sin(256, rot_dim) if rot_dim else None
    return qkv, positions, pool, meta, dict(num_heads=heads, num_kv_heads=kv_heads, q_norm_weight=weights[0],
                                            k_norm_weight=weights[1], norm_eps=1e-6, cos_sin=cos_sin, rot_dim=rot_dim)


def _cpu(x):
    return x.cpu().float() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,softcap", ATTN_CASES)
@pytest.mark.parametrize("rot_dim,norm", [(0, False), (None, True), (8, False)])  # None: the full head dim
@pytest.mark.parametrize("num_seqs", [1, 9])
def test_qkv_attention_decode_fused(dtype, heads, kv_heads, head_dim, window, softcap, rot_dim, norm, num_seqs,
                                    monkeypatch):
    """One kernel (norms, rotary, KV write, attention; then the split merge) against prepare_qkv + paged_attention
    in float32 on CPU: the same output, the new tokens' k and v in the pool, and nothing else in the pool changed."""
    from ember.ops.triton import attention as tri_attn

    monkeypatch.setattr(tri_attn, "FUSE_MAX_PROGRAMS_PER_SM", 64)  # fused at every batch here (off by default)
    rot_dim = head_dim if rot_dim is None else rot_dim
    qkv, positions, pool, meta, kw = _qkv_decode_case(heads, kv_heads, head_dim, rot_dim, norm, num_seqs, dtype,
                                                      seed=heads * 10 + num_seqs)
    scale = head_dim ** -0.5
    tensors = {f.name: getattr(meta, f.name) for f in fields(meta)}
    cpu_meta = replace(meta, **{k: v.cpu() for k, v in tensors.items() if isinstance(v, torch.Tensor)})
    ref_pool = _cpu(pool)
    ref = ref_attn.qkv_attention(_cpu(qkv), positions.cpu(), ref_pool, cpu_meta, scale=scale, sliding_window=window,
                                 softcap=softcap, **{k: _cpu(v) for k, v in kw.items()})
    got_pool = pool.clone()
    got = tri.qkv_attention(qkv, positions, got_pool, meta, scale=scale, sliding_window=window, softcap=softcap, **kw)
    close(got, ref.to(DEVICE), dtype)
    slots = meta.slot_mapping.cpu()
    for i in range(2):
        close(got_pool[i].flatten(0, 1).cpu().float()[slots], ref_pool[i].flatten(0, 1)[slots], dtype)
    untouched = ~torch.isin(torch.arange(pool[0].flatten(0, 1).shape[0]), slots)
    assert torch.equal(got_pool.flatten(1, 2)[:, untouched.to(DEVICE)], pool.flatten(1, 2)[:, untouched.to(DEVICE)])


@pytest.mark.parametrize("config", [
    dict(num_splits=1, BLOCK_N=16, num_warps=4, num_stages=1, HEADS_FIRST=False),
    dict(num_splits=3, BLOCK_N=16, num_warps=4, num_stages=1, HEADS_FIRST=True),
    dict(num_splits=16, BLOCK_N=16, num_warps=4, num_stages=1, HEADS_FIRST=False),  # most splits are empty
])
def test_decode_launch_configs_agree(config):
    """Every grid order and split count the benchmark sweeps gives the reference's output, fused or not."""
    from ember.ops.triton import attention as tri_attn

    dtype = DTYPES[0]
    qkv, positions, pool, meta, kw = _qkv_decode_case(8, 2, 32, 32, True, 5, dtype, seed=3)
    ref_pool = pool.clone()
    ref = ref_attn.qkv_attention(qkv, positions, ref_pool, meta, scale=0.2, **kw)
    got = torch.empty_like(ref)
    tri_attn._decode(qkv, pool, meta, got, 0.2, None, None, config=config, fused=dict(kw, positions=positions))
    close(got, ref, dtype)
    q = ref_attn.prepare_qkv(qkv.clone(), positions, pool.clone(), meta.slot_mapping, 8, 2, kw["q_norm_weight"],
                             kw["k_norm_weight"], 1e-6, kw["cos_sin"], 32)
    tri_attn._decode(q, ref_pool, meta, got, 0.2, None, None, config=config)
    close(got, ref, dtype)


def test_qkv_attention_decode_skips_negative_slots():
    qkv, positions, pool, meta, kw = _qkv_decode_case(4, 2, 16, 16, False, 3, DTYPES[0], seed=4)
    meta = replace(meta, slot_mapping=torch.full_like(meta.slot_mapping, -1))
    before = pool.clone()
    tri.qkv_attention(qkv, positions, pool, meta, scale=0.25, **kw)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,softcap", ATTN_CASES)
@pytest.mark.parametrize("pack", [True, False])
def test_paged_prefill_with_context(dtype, heads, kv_heads, head_dim, window, softcap, pack, monkeypatch):
    # fresh prompts, chunks after cached context, and decodes mixed in one step; the tiles with every query head
    # of a kv head (pack) or one head each
    from ember.ops.triton import attention as tri_attn

    monkeypatch.setattr(tri_attn, "PREFILL_PACK_GQA", pack)
    query_lens, context = [37, 1, 20, 5, 1], [0, 40, 33, 0, 3]
    q, pool, meta = _batch(query_lens, context, heads, kv_heads, head_dim, dtype, heads + head_dim)
    scale = head_dim ** -0.5
    ref = reference_attention(q, pool, meta, scale, window, softcap)
    close(tri.paged_attention(q, pool, meta, scale, window, softcap), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,softcap", [ATTN_CASES[0], ATTN_CASES[3], ATTN_CASES[6]])
@pytest.mark.parametrize("pack", [True, False])
def test_paged_prefill_as_a_captured_step(dtype, heads, kv_heads, head_dim, window, softcap, pack, monkeypatch):
    """A captured mixed step's metadata (worker/cuda_graph.py): the step's sequences (one of them with no queries),
    then empty slots, and host lists that give only the shape. The prefill kernel's flat grid finds each program's
    sequence and tile on the device: the same output as the reference over the step's own metadata."""
    from ember.ops.triton import attention as tri_attn

    monkeypatch.setattr(tri_attn, "PREFILL_PACK_GQA", pack)
    query_lens, context = [37, 1, 20, 0, 5, 1, 70], [0, 40, 33, 0, 0, 3, 0]
    q, pool, meta = _batch(query_lens, context, heads, kv_heads, head_dim, dtype, heads + head_dim + 1)
    scale = head_dim ** -0.5
    ref = reference_attention(q, pool, replace(meta, **_without_empty(meta)), scale, window, softcap)
    t, slots = q.shape[0], len(query_lens) + 9
    empty = slots - len(query_lens)
    captured = replace(
        meta, query_start_loc=torch.cat([meta.query_start_loc, meta.query_start_loc[-1:].repeat(empty)]),
        seq_lens=torch.cat([meta.seq_lens, meta.seq_lens.new_zeros(empty)]),
        block_tables=torch.cat([meta.block_tables, meta.block_tables.new_zeros(empty, meta.block_tables.shape[1])]),
        max_query_len=t, query_start_loc_cpu=[0] + [t] * slots, seq_lens_cpu=[t] * slots, captured=True)
    close(tri.paged_attention(q, pool, captured, scale, window, softcap), ref, dtype)


def _without_empty(meta: AttentionMetadata) -> dict:
    """The metadata's tensors and host lists without its sequences of no queries (which the reference cannot take)."""
    qsl, lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
    keep = [i for i in range(len(lens)) if qsl[i + 1] > qsl[i]]
    return dict(query_start_loc=torch.tensor([qsl[0]] + [qsl[i + 1] for i in keep], dtype=torch.int32, device=DEVICE),
                seq_lens=meta.seq_lens[keep], block_tables=meta.block_tables[keep],
                query_start_loc_cpu=[qsl[0]] + [qsl[i + 1] for i in keep], seq_lens_cpu=[lens[i] for i in keep])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [256, 512])
def test_paged_prefill_wide_heads(dtype, head_dim):
    """Gemma 4's head widths through the prefill tiles prefill_config picks for them (in float32 on a GPU: half
    the keys of bf16's, which would not fit an SM's shared memory)."""
    q, pool, meta = _batch([21, 6, 1], [0, 40, 9], 8, 4, head_dim, dtype, head_dim + 3)
    ref = reference_attention(q, pool, meta, 1.0, None, None)
    close(tri.paged_attention(q, pool, meta, 1.0, None, None), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,softcap", ATTN_CASES)
def test_paged_prefill_long_queries_by_flash_attention(monkeypatch, dtype, heads, kv_heads, head_dim, window, softcap):
    """Sequences with many queries go to SDPA (a fresh prompt: causal; a chunk after cached context: causal from
    the bottom right); the rest, decodes included, to the prefill kernel. Same result as the reference."""
    from ember.ops.triton import attention as tri_attn
    monkeypatch.setattr(tri_attn, "FLASH_PREFILL_MIN_QUERY", 16)
    calls = []
    flash = tri_attn._flash_prefill
    monkeypatch.setattr(tri_attn, "_flash_prefill", lambda q, kv, meta, out, seq, scale: (
        calls.append(seq), flash(q, kv, meta, out, seq, scale)))
    query_lens, context = [37, 1, 20, 5, 1], [0, 40, 33, 0, 3]
    q, pool, meta = _batch(query_lens, context, heads, kv_heads, head_dim, dtype, heads + head_dim + 1)
    scale = head_dim ** -0.5
    out = tri.paged_attention(q, pool, meta, scale, window, softcap)
    close(out, reference_attention(q, pool, meta, scale, window, softcap), dtype)
    eligible = window is None and softcap is None and (DEVICE == "cpu" or dtype != torch.float32)
    assert calls == ([0, 2] if eligible else [])


def test_prefill_kernel_skips_sequences_sent_to_flash_attention(monkeypatch):
    """The prefill kernel leaves the long sequences' rows to SDPA (here a stand-in that writes zeros) and computes
    every other row, also when all of them are long (no kernel launch)."""
    from ember.ops.triton import attention as tri_attn
    monkeypatch.setattr(tri_attn, "FLASH_PREFILL_MIN_QUERY", 16)
    monkeypatch.setattr(tri_attn, "_flash_prefill", lambda q, kv, meta, out, seq, scale: out[
        meta.query_start_loc_cpu[seq]:meta.query_start_loc_cpu[seq + 1]].zero_())
    dtype = DTYPES[-1]  # float32 on CPU; bfloat16 on a GPU (its flash attention takes no float32)
    for query_lens, context in (([3, 30, 1, 17, 6], [5, 0, 20, 9, 0]), ([16, 40], [0, 7])):
        q, pool, meta = _batch(query_lens, context, 4, 2, 16, dtype, 3)
        out = tri.paged_attention(q, pool, meta, 0.25)
        ref = reference_attention(q, pool, meta, 0.25, None, None)
        starts = meta.query_start_loc_cpu
        for i, n in enumerate(query_lens):
            rows = slice(starts[i], starts[i + 1])
            if n >= 16:
                assert (out[rows] == 0).all()
            else:
                close(out[rows], ref[rows], dtype)


FP8 = torch.float8_e4m3fn


def assert_same_fp8(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Two fp8 pools hold the same values: bit for bit from float32; from bf16 the reference rounds to bf16 before
    fp8 and the kernels round from float32, so an element may differ by one fp8 step (1/8 relative)."""
    got, ref = got.cpu().float(), ref.cpu().float()
    assert torch.isfinite(got).all()
    if dtype == torch.float32:
        assert torch.equal(got, ref)
    else:
        torch.testing.assert_close(got, ref, rtol=0.125, atol=2.0**-9)


def test_fp8_pool_writes_saturate():
    """Keys and values beyond fp8's range are stored as +-448 (a plain cast gives NaN), by the reference and the
    kernel alike; the rest round to the nearest fp8 value."""
    g = torch.Generator().manual_seed(8)
    k = torch.randn(5, 2, 16, generator=g) * torch.tensor([1.0, 1000.0])[None, :, None]
    v = -k
    slots = torch.tensor([3, 17, 40, 2, -1])
    pools = [torch.zeros(2, 3, BLOCK_SIZE, 2, 16, dtype=FP8, device=DEVICE) for _ in range(2)]
    ref_attn.write_kv(pools[0], k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    tri.write_kv(pools[1], k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    assert_same_fp8(pools[1], pools[0], torch.float32)
    flat = pools[0].cpu().float().view(2, -1, 2, 16)
    assert torch.equal(flat[0, 17, 1], k[1, 1].clamp(-448, 448).to(FP8).float())
    assert (flat[1, 17, 1].abs() == 448).sum() == (k[1, 1].abs() > 464).sum() > 0  # 464: halfway to the next step
    assert torch.equal(flat[0, 40, 0], k[2, 0].to(FP8).float())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["llama", "v_norm", "k_as_v"])
def test_prepare_qkv_into_an_fp8_pool(dtype, variant):
    """q as with a pool in the model dtype; k and v rounded to fp8 where they are stored."""
    g = torch.Generator().manual_seed(len(variant))
    heads, kv_heads, head_dim, num_tokens, num_blocks, rot_dim = 4, 2, 32, 9, 5, 32
    kv_parts = 1 if variant == "k_as_v" else 2
    qkv = (torch.randn(num_tokens, (heads + kv_parts * kv_heads) * head_dim, generator=g) * 3).to(DEVICE, dtype)
    positions = torch.randint(0, 200, (num_tokens,), generator=g).to(DEVICE)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:num_tokens].to(DEVICE)
    qw, kw = ((1 + 0.1 * torch.randn(head_dim, generator=g)).to(DEVICE, dtype) for _ in range(2))
    pools = [torch.zeros(2, num_blocks, BLOCK_SIZE, kv_heads, head_dim, dtype=FP8, device=DEVICE) for _ in range(2)]
    args = (heads, kv_heads, qw, kw, 1e-6, _cos_sin(256, rot_dim), rot_dim, variant == "v_norm", variant == "k_as_v")
    q_ref = ref_attn.prepare_qkv(qkv.clone(), positions, pools[0], slots, *args)
    q_tri = tri.prepare_qkv(qkv.clone(), positions, pools[1], slots, *args)
    close(q_tri, q_ref, dtype)
    assert_same_fp8(pools[1], pools[0], dtype)
    written = pools[0].view(torch.uint8).view(2, -1, kv_heads * head_dim).any(-1)
    assert written.sum() == 2 * num_tokens and written[:, slots.cpu()].all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["decode", "decode_split", "prefill", "prefill_flash"])
def test_paged_attention_over_an_fp8_pool(dtype, case, monkeypatch):
    """Every attention path reads an fp8 pool as the reference does: its values, in the model dtype."""
    from ember.ops.triton import attention as tri_attn

    query_lens, context = {"decode": ([1] * 9, [5, 40, 0, 77, 16, 3, 90, 31, 8]), "decode_split": ([1], [70]),
                           "prefill": ([37, 1, 20, 5, 1], [0, 40, 33, 0, 3]),
                           "prefill_flash": ([37, 1, 20, 5, 1], [0, 40, 33, 0, 3])}[case]
    monkeypatch.setattr(tri_attn, "FLASH_PREFILL_MIN_QUERY", 16 if case == "prefill_flash" else 0)
    calls = []
    flash = tri_attn._flash_prefill
    monkeypatch.setattr(tri_attn, "_flash_prefill", lambda *a: (calls.append(a[4]), flash(*a)))
    q, pool, meta = _batch(query_lens, context, 8, 2, 64, dtype, len(case))
    pool = pool.to(FP8)
    ref = reference_attention(q, pool, meta, 0.125, None, None)
    close(tri.paged_attention(q, pool, meta, 0.125, None, None), ref, dtype)
    assert calls == ([0, 2] if case == "prefill_flash" and (DEVICE == "cpu" or dtype != torch.float32) else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_seqs", [1, 9])
def test_qkv_attention_decode_fused_into_an_fp8_pool(dtype, num_seqs, monkeypatch):
    """The fused decode kernel stores the new token's k and v as fp8 and attends to them as stored."""
    from ember.ops.triton import attention as tri_attn

    monkeypatch.setattr(tri_attn, "FUSE_MAX_PROGRAMS_PER_SM", 64)
    qkv, positions, pool, meta, kw = _qkv_decode_case(8, 2, 32, 32, True, num_seqs, dtype, seed=num_seqs)
    pool = pool.to(FP8)
    tensors = {f.name: getattr(meta, f.name) for f in fields(meta)}
    cpu_meta = replace(meta, **{k: v.cpu() for k, v in tensors.items() if isinstance(v, torch.Tensor)})
    ref_pool = pool.cpu()
    ref = ref_attn.qkv_attention(_cpu(qkv), positions.cpu(), ref_pool, cpu_meta, scale=0.2,
                                 **{k: _cpu(v) for k, v in kw.items()})
    got = tri.qkv_attention(qkv, positions, pool, meta, scale=0.2, **kw)
    close(got, ref.to(DEVICE), dtype)
    assert_same_fp8(pool, ref_pool, dtype)


GEMV_SHAPES = [(64, 96), (37, 200), (1030, 64), (24, 2100), (24, 8300)]  # n, k: ragged and multi-block in both;
# the last takes the long-K tile


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemv(dtype, n, k, bias):
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    close(tri.linear(x, w, b), ref_gemm.linear(x.float(), w.float(), None if b is None else b.float()), dtype)
    wide = torch.randn(1, 2 * k, generator=g).to(DEVICE, dtype)  # a strided view reads the same values
    close(tri.linear(wide[:, :k], w), ref_gemm.linear(wide[:, :k].float(), w.float()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu"])
def test_gemv_gated(dtype, n, k, act):
    g = torch.Generator().manual_seed(n + k + 7)
    gate_up = (2 * torch.randn(1, 2 * k, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    ref = ref_gemm.gated_linear(gate_up.cpu(), w.cpu(), None, act).to(DEVICE)  # rounded where the kernel rounds
    close(tri.gated_linear(gate_up, w, None, act), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("with_residual,weight_offset", [(False, None), (True, None), (True, 1.0), (True, 0.0)])
def test_gemv_rms_norm(dtype, n, k, with_residual, weight_offset):
    g = torch.Generator().manual_seed(n + k + 11)
    x = (3 * torch.randn(1, k, generator=g)).to(DEVICE, dtype)
    r = torch.randn(1, k, generator=g).to(DEVICE, dtype) if with_residual else None
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype)
    out, res = tri.rms_norm_linear(x, r, nw, 1e-6, w, b, weight_offset)
    ref_out, ref_res = ref_gemm.rms_norm_linear(x.cpu(), None if r is None else r.cpu(), nw.cpu(), 1e-6, w.cpu(),
                                                b.cpu(), weight_offset)
    close(out, ref_out.to(DEVICE), dtype)
    assert torch.equal(res.cpu(), ref_res)  # the residual stream is exact


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
def test_gemv_act_mul_of_separate_inputs(dtype, n, k, act):
    """act(gate) * up in the GEMV's prologue, up a row of a wider tensor (Gemma 4's per-layer input slice)."""
    g = torch.Generator().manual_seed(n + k + 13)
    gate = (2 * torch.randn(1, k, generator=g)).to(DEVICE, dtype)
    per_layer = torch.randn(1, 3, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    ref = ref_gemm.act_mul_linear(gate.cpu(), per_layer[:, 1].cpu(), w.cpu(), None, act).to(DEVICE)
    close(tri.act_mul_linear(gate, per_layer[:, 1], w, None, act), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("weight_offset", [None, 0.0, 1.0])
def test_gemv_rms_norm_then_residual_add(dtype, n, k, weight_offset):
    """residual + norm(x) in the GEMV's prologue (a sandwich norm): the projection of that sum, and the sum itself
    (the residual stream; within rounding, as the norm's statistics are summed in another order)."""
    g = torch.Generator().manual_seed(n + k + 19)
    x = (3 * torch.randn(1, k, generator=g)).to(DEVICE, dtype)
    r = torch.randn(1, k, generator=g).to(DEVICE, dtype)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    out, h = tri.rms_norm_add_linear(x, r, nw, 1e-6, w, None, weight_offset)
    ref_out, ref_h = ref_gemm.rms_norm_add_linear(x.cpu(), r.cpu(), nw.cpu(), 1e-6, w.cpu(), None, weight_offset)
    close(out, ref_out.to(DEVICE), dtype)
    close(h, ref_h.to(DEVICE), dtype)


def test_gemv_rms_norm_unfused_past_the_fusion_limit(monkeypatch):
    """Large projections run the norm kernel, then the GEMV: the same results as the fused prologue."""
    from ember.ops.triton import gemm as tri_gemm
    g = torch.Generator().manual_seed(5)
    x, r = torch.randn(1, 200, generator=g).to(DEVICE), torch.randn(1, 200, generator=g).to(DEVICE)
    nw, w = (1 + 0.1 * torch.randn(200, generator=g)).to(DEVICE), torch.randn(70, 200, generator=g).to(DEVICE)
    fused = tri.rms_norm_linear(x, r, nw, 1e-6, w)
    fused_post = tri.rms_norm_add_linear(x, r, nw, 1e-6, w)
    monkeypatch.setattr(tri_gemm, "NORM_FUSE_MAX_WEIGHT", 0)
    unfused = tri.rms_norm_linear(x, r, nw, 1e-6, w)
    unfused_post = tri.rms_norm_add_linear(x, r, nw, 1e-6, w)
    close(unfused[0], fused[0], x.dtype)
    assert torch.equal(unfused[1], fused[1])
    close(unfused_post[0], fused_post[0], x.dtype)
    assert torch.equal(unfused_post[1], fused_post[1])


@pytest.mark.parametrize("fn", ["linear", "gated_linear", "act_mul_linear", "rms_norm_linear", "rms_norm_add_linear"])
def test_gemv_ops_take_cublas_past_one_row(fn):
    """Several rows: the separate kernels and F.linear, with the reference's results."""
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(3, 64, generator=g).to(DEVICE), torch.randn(3, 64, generator=g).to(DEVICE)
    w = torch.randn(24, 64, generator=g).to(DEVICE)
    if fn == "linear":
        assert torch.equal(tri.linear(x, w), ref_gemm.linear(x, w))
    elif fn == "gated_linear":
        gate_up = torch.cat([x, r], -1)
        close(tri.gated_linear(gate_up, w), ref_gemm.gated_linear(gate_up.cpu(), w.cpu()).to(DEVICE), x.dtype)
    elif fn == "act_mul_linear":
        close(tri.act_mul_linear(x, r, w), ref_gemm.act_mul_linear(x.cpu(), r.cpu(), w.cpu()).to(DEVICE), x.dtype)
    elif fn == "rms_norm_add_linear":
        nw = torch.ones(64, device=DEVICE)
        out, h = tri.rms_norm_add_linear(x, r, nw, 1e-6, w)
        ref_out, ref_h = ref_gemm.rms_norm_add_linear(x.cpu(), r.cpu(), nw.cpu(), 1e-6, w.cpu())
        close(out, ref_out.to(DEVICE), x.dtype)
        close(h, ref_h.to(DEVICE), x.dtype)
    else:
        nw = torch.ones(64, device=DEVICE)
        out, res = tri.rms_norm_linear(x, r, nw, 1e-6, w)
        ref_out, ref_res = ref_gemm.rms_norm_linear(x.cpu(), r.cpu(), nw.cpu(), 1e-6, w.cpu())
        close(out, ref_out.to(DEVICE), x.dtype)
        assert torch.equal(res.cpu(), ref_res)


@pytest.mark.parametrize("weight_offset", [None, 1.0])
def test_down_projection_split_k_partials_summed_in_the_next_norm(weight_offset, monkeypatch):
    """At decode batch sizes a bf16 down projection comes back as float32 split-K partials; the next add + RMSNorm
    (alone or before a projection) sums them, rounded to bf16 first as a GEMM's own reduce rounds: the residual
    stream equals the reference's on that sum, and both outputs match the unsplit path."""
    from ember.ops.triton import gemm as tri_gemm
    g = torch.Generator().manual_seed(17)
    dt, k, n = torch.bfloat16, 96, 64
    gate_up = (2 * torch.randn(130, 2 * k, generator=g)).to(DEVICE, dt)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dt)
    r = torch.randn(130, n, generator=g).to(DEVICE, dt)
    nw = (0.1 * torch.randn(n, generator=g)).to(DEVICE, dt) + (1 - (weight_offset or 0))
    w2 = (torch.randn(24, n, generator=g) / n ** 0.5).to(DEVICE, dt)
    parts = tri.gated_linear_parts(gate_up, w)
    assert parts.shape == (2, 130, n) and parts.dtype == torch.float32
    unsplit = ref_gemm.gated_linear(gate_up.float().cpu(), w.float().cpu())  # float32 throughout
    assert_close(parts.sum(0).cpu(), unsplit, 2e-2)
    h = parts.sum(0).to(dt)
    out, res = tri.add_rms_norm(parts, r, nw, 1e-6, weight_offset)
    ref_out, ref_res = ref_norm.add_rms_norm(h.cpu(), r.cpu(), nw.cpu(), 1e-6, weight_offset)
    if DEVICE == "cuda":
        assert torch.equal(res.cpu(), ref_res)
    else:  # the interpreter rounds float32 -> bf16 toward zero, not to nearest: one unit in the last place
        assert_close(res.float(), ref_res.float(), 1e-2)
    assert_close(out.float().cpu(), ref_out.float(), 2e-2)
    y, res2 = tri.rms_norm_linear(parts, r, nw, 1e-6, w2, None, weight_offset)
    assert torch.equal(res2, res)
    assert_close(y.float().cpu(), ref_gemm.linear(out.float().cpu(), w2.float().cpu()), 2e-2)
    assert tri.gated_linear_parts(gate_up[:5], w).shape == (5, n)  # below SPLIT_K_ROWS: the plain output
    monkeypatch.setattr(tri_gemm, "SPLIT_K_PARTS", 0)
    assert tri.gated_linear_parts(gate_up, w).shape == (130, n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 151936), (3, 1000), (37, 4099), (300, 64)])
def test_row_argmax_matches_torch_with_ties(dtype, rows, cols, monkeypatch):
    """The first index of each row's maximum, as torch.argmax: values on a coarse grid so rows hold many ties,
    rows of one repeated value, and a row whose maximum is its last column."""
    from ember.ops.triton import reduce as tri_reduce

    monkeypatch.setattr(tri_reduce, "MIN_ROWS", 1)  # the kernels at every batch size here
    g = torch.Generator().manual_seed(rows + cols)
    x = torch.randint(-8, 8, (rows, cols), generator=g).float()
    x[0] = 1.0  # every column ties: index 0
    if rows > 2:
        x[1, -1] = 100.0
        x[2] = float("-inf")
    x = x.to(DEVICE, dtype)  # small integers: exact in bf16 too
    assert torch.equal(tri.row_argmax(x), x.argmax(dim=-1))
    assert torch.equal(tri.row_argmax(x[:, : cols // 2]), x[:, : cols // 2].argmax(dim=-1))  # strided rows
