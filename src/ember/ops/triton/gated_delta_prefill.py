"""A prefill step's Gated DeltaNet core: the conv's windows (ember.ops.gated_delta.conv_windows: each sequence's
window before its first token copied in from its state slot, depthwise conv + SiLU of each token's window in the
step's token-major conv buffer, then the windows due copied into their slots, a captured plan's spare entries
skipped), and the chunked gated delta rule in two launches, with the signatures of
the torch references chunk_prepare and chunk_scan (ops.gated_delta.gated_delta_prefill runs them in turn):

1. chunk_prepare, grid (chunk, value head): the chunk's tokens read straight from the conv output (the plan's
   chunk_first / chunk_len; no padded copies), q/k l2-normed, the cumulative log decay, the masked and decayed
   k_beta k^T and q k^T [C, C], the inverse T of the unit lower-triangular (I + strictly_lower(k_beta k^T)) (its
   16-row diagonal blocks by forward substitution, then the blocks below through a nilpotent series, in [C, C]
   dots), and through it the UT transform: u = T (v beta), w = T (k beta e^g).
2. chunk_scan, grid (sequence with chunks, value head, Dv block): each program loads its [Dk, BLOCK_V] slice of the
   sequence's initial state from its read slot of the state pool (zeros where fresh), holds it in registers in fp32
   and runs its sequence's chunks in order (as flash-linear-attention's
   chunk_gated_delta_rule_fwd_h and chunk_fwd_o, fused):
       v_new = u - w @ S;    o = q @ S + intra @ v_new;    S = S * decay + k^T @ v_new
   storing o in token order and the output's dtype (the plan's chunk_first / chunk_len again) and, where the plan
   saves the state after the chunk, S.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ember.ops.gated_delta import ChunkPlan, states_due_first, write_states

# the dots' input precision: "tf32x3" (three tf32 tensor-core products per fp32 one: the error of fp32, ~3e-7 at
# qwen3_5-default's shape), "tf32" (one: ~7.7e-4, not growing over 128 chunks) or "ieee" (fp32 FMA; on an H100
# ~40x slower than tf32x3 at Dk 128, its [64, 128] x [128, BLOCK_V] fp32 tiles exhaust the registers). "auto": the
# prepare kernel in tf32 for bf16 / fp16 models (3x faster; its error is a fifth of the activations' own rounding,
# 2^-8) and tf32x3 for float32 ones; the scan, whose inputs are float32 either way, in tf32x3.
PRECISION = os.environ.get("EMBER_DELTA_SCAN_PRECISION", "auto")
if PRECISION not in ("auto", "tf32x3", "tf32", "ieee"):
    raise ValueError(f"EMBER_DELTA_SCAN_PRECISION={PRECISION!r}; allowed: auto, tf32x3, tf32, ieee")


def _precision(dtype: torch.dtype) -> str:
    if PRECISION != "auto":
        return PRECISION
    return "tf32x3" if dtype == torch.float32 else "tf32"


# the scan's Dv slice per program (0: 32): narrower slices give more programs where few sequences run (one long
# prompt: num_heads * Dv / BLOCK_V programs), wider ones fewer reloads of w, q, k and the intra-chunk matrix
SCAN_BLOCK_V = int(os.environ.get("EMBER_DELTA_SCAN_BLOCK_V", "0"))
# the scan's software pipeline depth over chunks: each stage buffers a chunk's w, q, k, u and intra in shared
# memory (~120 KiB at Dk 128, chunk 64, BLOCK_V 32), so Triton's default of 3 needs 256 KiB, more than a Hopper
# SM has (227 KiB); 1 holds ~56 KiB and lets several programs share an SM
SCAN_STAGES = int(os.environ.get("EMBER_DELTA_SCAN_STAGES", "2"))
_scan_stages: dict[tuple, int] = {}  # the depth that fitted, per scan configuration


@triton.jit
def _conv_windows_kernel(buf_ptr, w_ptr, cols_ptr, out_ptr, num_tokens, channels, stride_buf, stride_w, stride_out,
                         KERNEL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_mask, ch_mask = t < num_tokens, ch < channels
    mask = t_mask[:, None] & ch_mask[None, :]
    last = tl.load(cols_ptr + t, mask=t_mask, other=KERNEL - 1).to(tl.int64)  # the window's last buffer row
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for i in tl.static_range(KERNEL):
        x = tl.load(buf_ptr + (last - (KERNEL - 1 - i))[:, None] * stride_buf + ch[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + ch * stride_w + i, mask=ch_mask, other=0.0)
        acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
    acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)  # the reference's conv output is in the weight's dtype
    tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_out + ch[None, :],
             (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _window_copy_kernel(buf_ptr, cols_ptr, slots_ptr, fresh_ptr, state_ptr, channels, stride_buf, stride_slot,
                        stride_ch, TO_STATE: tl.constexpr, WIDTH: tl.constexpr, W_PAD: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    """One conv window per program (x a channel block) between buffer rows cols[i] and conv state slot slots[i]:
    into the buffer (a sequence's window before its first token; zeros where fresh[i]) or, TO_STATE, into the slot
    (a window due; slot -1: a captured plan's spare entry)."""
    slot = tl.load(slots_ptr + tl.program_id(0)).to(tl.int64)
    if TO_STATE:
        if slot < 0:
            return
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    j = tl.arange(0, W_PAD)
    rows = tl.load(cols_ptr + tl.program_id(0) * WIDTH + j, mask=j < WIDTH, other=0).to(tl.int64)
    mask = (ch < channels)[:, None] & (j < WIDTH)[None, :]
    buf = buf_ptr + rows[None, :] * stride_buf + ch[:, None]  # [BLOCK_C, W_PAD]: the window, channel-major
    state = state_ptr + slot * stride_slot + ch[:, None] * stride_ch + j[None, :]
    if TO_STATE:
        tl.store(state, tl.load(buf, mask=mask).to(state_ptr.dtype.element_ty), mask=mask)
    else:
        carried = tl.where(tl.load(fresh_ptr + tl.program_id(0)) == 0, WIDTH, 0)  # columns read from the slot
        x = tl.load(state, mask=(ch < channels)[:, None] & (j < carried)[None, :], other=0.0)
        tl.store(buf, x.to(buf_ptr.dtype.element_ty), mask=mask)


def conv_windows(buf: torch.Tensor, weight: torch.Tensor, plan: ChunkPlan, out_dtype: torch.dtype,
                 conv_state: torch.Tensor) -> torch.Tensor:
    channels, kernel = weight.shape
    cols = plan.token_cols
    assert buf.shape[1] == channels and buf.stride(1) == 1 and weight.stride(1) == 1 and kernel == plan.width + 1
    assert conv_state.shape[1:] == (channels, plan.width) and conv_state.stride(2) == 1
    assert plan.save_cols.is_contiguous() and plan.state_cols.is_contiguous()
    out = torch.empty(cols.shape[0], channels, dtype=out_dtype, device=buf.device)
    block_c = min(256, triton.next_power_of_2(channels))

    def copy(cols: torch.Tensor, slots: torch.Tensor, fresh: torch.Tensor, to_state: bool) -> None:
        _window_copy_kernel[(slots.shape[0], triton.cdiv(channels, block_c))](
            buf, cols, slots, fresh, conv_state, channels, buf.stride(0), conv_state.stride(0), conv_state.stride(1),
            TO_STATE=to_state, WIDTH=plan.width, W_PAD=triton.next_power_of_2(plan.width), BLOCK_C=block_c,
            num_warps=4,
        )

    fresh = plan.fresh.view(torch.uint8)
    if plan.reads.numel():  # each sequence's window before its first token, from its read slot
        copy(plan.state_cols, plan.reads, fresh, False)
    if cols.numel():
        _conv_windows_kernel[(triton.cdiv(cols.shape[0], 16), triton.cdiv(channels, block_c))](
            buf, weight, cols, out, cols.shape[0], channels, buf.stride(0), weight.stride(0), out.stride(0),
            KERNEL=kernel, BLOCK_T=16, BLOCK_C=block_c, num_warps=4,
        )
    if plan.save_slots.numel():  # the windows due into their slots, after every read of the state
        copy(plan.save_cols, plan.save_slots, fresh, True)
    return out


@triton.jit
def _chunk_scan_kernel(w_ptr, u_ptr, q_ptr, k_ptr, a_ptr, decay_ptr, states_ptr, reads_ptr, fresh_ptr, out_ptr,
                       scan_seqs_ptr, starts_ptr, save_ptr, row_slots_ptr, first_ptr, len_ptr, num_heads,
                       HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_V: tl.constexpr, ROW_SLOTS: tl.constexpr, PRECISION: tl.constexpr):
    seq = tl.load(scan_seqs_ptr + tl.program_id(0))  # the sequences with chunks; -1: a captured plan's spare one
    if seq < 0:
        return
    first = tl.load(starts_ptr + seq)
    last = tl.load(starts_ptr + seq + 1)
    head = tl.program_id(1)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    c = tl.arange(0, CHUNK)
    k_mask, v_mask = dk < HEAD_K, dv < HEAD_V
    state_tile = dk[:, None] * HEAD_V + dv[None, :]
    state_mask = k_mask[:, None] & v_mask[None, :]
    slot = tl.load(reads_ptr + seq)  # the sequence's initial state: its read slot, or zeros where fresh
    h = tl.load(states_ptr + (slot * num_heads + head) * HEAD_K * HEAD_V + state_tile, mask=state_mask,
                other=0.0).to(tl.float32)
    h = tl.where(tl.load(fresh_ptr + seq) != 0, 0.0, h)
    for n in range(first, last):
        base = (n * num_heads + head).to(tl.int64) * CHUNK  # row of this chunk's first token in [N, H, C, ...]
        rows_k = (base + c[:, None]) * HEAD_K + dk[None, :]
        rows_v = (base + c[:, None]) * HEAD_V + dv[None, :]
        w = tl.load(w_ptr + rows_k, mask=k_mask[None, :], other=0.0)
        u = tl.load(u_ptr + rows_v, mask=v_mask[None, :], other=0.0)
        v_new = u - tl.dot(w, h, input_precision=PRECISION)
        q = tl.load(q_ptr + rows_k, mask=k_mask[None, :], other=0.0)
        a = tl.load(a_ptr + (base + c[:, None]) * CHUNK + c[None, :])
        o = tl.dot(q, h, input_precision=PRECISION) + tl.dot(a, v_new, input_precision=PRECISION)
        tokens = (tl.load(first_ptr + n) + c).to(tl.int64)  # out is [T, H, Dv], in token order
        tl.store(out_ptr + (tokens[:, None] * num_heads + head) * HEAD_V + dv[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=(c < tl.load(len_ptr + n))[:, None] & v_mask[None, :])
        k = tl.load(k_ptr + rows_k, mask=k_mask[None, :], other=0.0)
        decay = tl.load(decay_ptr + n * num_heads + head)
        h = h * decay + tl.dot(tl.trans(k), v_new, input_precision=PRECISION)
        row = tl.load(save_ptr + n)
        if row >= 0:  # the state after this chunk is due: into each slot of its row (read by no other program)
            for j in tl.static_range(ROW_SLOTS):
                dst = tl.load(row_slots_ptr + row * ROW_SLOTS + j)
                if dst >= 0:
                    tl.store(states_ptr + (dst * num_heads + head) * HEAD_K * HEAD_V + state_tile,
                             h.to(states_ptr.dtype.element_ty), mask=state_mask)


@triton.jit
def _chunk_prepare_kernel(x_ptr, g_ptr, beta_ptr, first_ptr, len_ptr, w_ptr, u_ptr, q_ptr, k_ptr, a_ptr, decay_ptr,
                          stride_x, stride_g, stride_beta, num_heads, scale,
                          NUM_K_HEADS: tl.constexpr, HEAD_K: tl.constexpr, HEAD_V: tl.constexpr,
                          CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                          PRECISION: tl.constexpr):
    n = tl.program_id(0)
    head = tl.program_id(1)
    kh = head // (num_heads // NUM_K_HEADS)  # each key head serves consecutive value heads
    c = tl.arange(0, CHUNK)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.arange(0, BLOCK_V)
    k_mask, v_mask = dk < HEAD_K, dv < HEAD_V
    length = tl.load(len_ptr + n)
    if length == 0:  # a captured plan's spare chunk: no sequence's range reaches it
        return
    first = tl.load(first_ptr + n)
    row_mask = c < length
    rows = (first + c).to(tl.int64)
    x_rows = x_ptr + rows[:, None] * stride_x
    q = tl.load(x_rows + kh * HEAD_K + dk[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
    k = tl.load(x_rows + (NUM_K_HEADS + kh) * HEAD_K + dk[None, :], mask=row_mask[:, None] & k_mask[None, :],
                other=0.0)
    v = tl.load(x_rows + 2 * NUM_K_HEADS * HEAD_K + head * HEAD_V + dv[None, :],
                mask=row_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
    q, k = q.to(tl.float32), k.to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None] * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
    beta = tl.load(beta_ptr + rows * stride_beta + head, mask=row_mask, other=0.0).to(tl.float32)
    g = tl.cumsum(tl.load(g_ptr + rows * stride_g + head, mask=row_mask, other=0.0).to(tl.float32), axis=0)
    g_last = tl.sum(tl.where(c == CHUNK - 1, g, 0.0), axis=0)
    causal = c[:, None] >= c[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, g[:, None] - g[None, :], 0.0)), 0.0)  # [C, C]
    k_beta = k * beta[:, None]
    lower = tl.where(c[:, None] > c[None, :],
                     tl.dot(k_beta, tl.trans(k), input_precision=PRECISION) * decay, 0.0)
    intra = tl.dot(q, tl.trans(k), input_precision=PRECISION) * decay
    # t = (I + lower)^-1 in blocks of 16 rows. With lower = B + R (B its diagonal blocks, R the rest, below them):
    # I + lower = (I + B)(I + D R) for D = (I + B)^-1, and N = D R is nilpotent over the CHUNK / 16 blocks, so
    # t = (I - N + N^2 - ...) D. D by forward substitution, row i of every block at once: d[r] = e_r - (B d)[r]
    # (rows past i are still e_j and B is strictly lower within its block).
    eye = tl.where(c[:, None] == c[None, :], 1.0, 0.0)
    same_block = (c[:, None] // 16) == (c[None, :] // 16)
    diag_blocks = tl.where(same_block, lower, 0.0)
    d = eye
    for i in range(1, 16):
        d = tl.where((c % 16 == i)[:, None], eye - tl.dot(diag_blocks, d, input_precision=PRECISION), d)
    n_rest = tl.dot(d, tl.where(same_block, 0.0, lower), input_precision=PRECISION)
    series = eye - n_rest
    for _ in tl.static_range(CHUNK // 16 - 2):
        series = eye - tl.dot(n_rest, series, input_precision=PRECISION)
    t = tl.dot(series, d, input_precision=PRECISION)
    u = tl.dot(t, v * beta[:, None], input_precision=PRECISION)
    w = tl.dot(t, k_beta * tl.exp(g)[:, None], input_precision=PRECISION)
    base = (n * num_heads + head).to(tl.int64) * CHUNK
    out_k = (base + c[:, None]) * HEAD_K + dk[None, :]
    tl.store(w_ptr + out_k, w, mask=k_mask[None, :])
    tl.store(q_ptr + out_k, q * tl.exp(g)[:, None], mask=k_mask[None, :])
    tl.store(k_ptr + out_k, k * tl.exp(g_last - g)[:, None], mask=k_mask[None, :])
    tl.store(u_ptr + (base + c[:, None]) * HEAD_V + dv[None, :], u, mask=v_mask[None, :])
    tl.store(a_ptr + (base + c[:, None]) * CHUNK + c[None, :], intra)
    tl.store(decay_ptr + n * num_heads + head, tl.exp(g_last))


def chunk_prepare(x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, plan: ChunkPlan, num_k_heads: int,
                  head_k: int, head_v: int) -> tuple[torch.Tensor, ...]:
    num_heads, chunk, num_chunks = g.shape[-1], plan.chunk_size, plan.num_chunks
    assert x.shape[-1] == 2 * num_k_heads * head_k + num_heads * head_v and x.stride(-1) == 1
    assert g.stride(-1) == 1 and beta.stride(-1) == 1 and num_heads % num_k_heads == 0
    assert chunk >= 16 and chunk == triton.next_power_of_2(chunk), "tl.dot needs a power-of-two chunk of >= 16"
    f32 = dict(dtype=torch.float32, device=x.device)
    w, q, k = (torch.empty(num_chunks, num_heads, chunk, head_k, **f32) for _ in range(3))
    u = torch.empty(num_chunks, num_heads, chunk, head_v, **f32)
    intra = torch.empty(num_chunks, num_heads, chunk, chunk, **f32)
    chunk_decay = torch.empty(num_chunks, num_heads, **f32)
    if num_chunks:
        _chunk_prepare_kernel[(num_chunks, num_heads)](
            x, g, beta, plan.chunk_first, plan.chunk_len, w, u, q, k, intra, chunk_decay,
            x.stride(0), g.stride(0), beta.stride(0), num_heads, head_k**-0.5,
            NUM_K_HEADS=num_k_heads, HEAD_K=head_k, HEAD_V=head_v, CHUNK=chunk,
            BLOCK_K=max(16, triton.next_power_of_2(head_k)), BLOCK_V=max(16, triton.next_power_of_2(head_v)),
            PRECISION=_precision(x.dtype), num_warps=8,
        )
    return w, u, q, k, intra, chunk_decay


def chunk_scan(w: torch.Tensor, u: torch.Tensor, q: torch.Tensor, k: torch.Tensor, intra: torch.Tensor,
               chunk_decay: torch.Tensor, states: torch.Tensor, plan: ChunkPlan,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    num_chunks, num_heads, chunk, head_k = w.shape
    head_v = u.shape[-1]
    for x in (w, u, q, k, intra, chunk_decay):
        assert x.is_contiguous() and x.dtype == torch.float32
    assert states.is_contiguous() and states.shape[1:] == (num_heads, head_k, head_v)
    assert u.shape == (num_chunks, num_heads, chunk, head_v) and intra.shape == (num_chunks, num_heads, chunk, chunk)
    assert chunk >= 16 and chunk == triton.next_power_of_2(chunk), "tl.dot needs a power-of-two chunk of >= 16"
    num_seqs = plan.scan_seqs.shape[0]
    out = u.new_empty(plan.token_pos.shape[0], num_heads, head_v, dtype=out_dtype or u.dtype)
    if num_chunks == 0 or num_seqs == 0:
        return out
    due_first = states_due_first(states, plan)  # read before the kernel writes any slot
    block_k = max(16, triton.next_power_of_2(head_k))
    block_v = min(SCAN_BLOCK_V or 32, max(16, triton.next_power_of_2(head_v)))
    precision = _precision(torch.float32)
    key = (head_k, head_v, chunk, block_v, precision, SCAN_STAGES)
    stages = _scan_stages.get(key, SCAN_STAGES)
    while True:  # the deepest pipeline that fits the SM's shared memory (see SCAN_STAGES)
        try:
            _chunk_scan_kernel[(num_seqs, num_heads, triton.cdiv(head_v, block_v))](
                w, u, q, k, intra, chunk_decay, states, plan.reads, plan.fresh.view(torch.uint8), out,
                plan.scan_seqs, plan.seq_chunks, plan.save_after, plan.row_slots, plan.chunk_first, plan.chunk_len,
                num_heads,
                HEAD_K=head_k, HEAD_V=head_v, CHUNK=chunk, BLOCK_K=block_k, BLOCK_V=block_v,
                ROW_SLOTS=plan.row_slots.shape[1], PRECISION=precision,
                num_warps=4, num_stages=stages,
            )
            break
        except OutOfResources:  # raised when the compiled kernel is loaded, before it runs
            if stages == 1:
                raise
            stages -= 1
    _scan_stages[key] = stages
    write_states(states, due_first)
    return out
