"""Gated DeltaNet decode step (one token per sequence) over state slots, with the signature of the torch reference
ember.ops.gated_delta.gated_delta_decode. Two launches, no host data, so a decode step can be graph-captured:

1. conv: per (sequence, channel block), the causal conv1d step + SiLU over [conv window | x], reading the window
   from slot `read` (zeros if read < 0) and writing the shifted window into slot `write`.
2. delta rule: per (sequence, value head, Dv block), l2norm and scale of q and k, then the gated delta rule update
   on the [Dk, BLOCK_DV] state tile held in registers in fp32, written back into slot `write`; the output o = S^T q.
   The layout follows flash-linear-attention's fused_recurrent_gated_delta_rule (grid over heads and Dv blocks).

The delta rule kernel also takes the one-token sequences of a chunked (prefill or mixed) step: step_rows, one
program per token the plan names, writing its state into each slot due (the working slot and a snapshot).

The conv is its own launch because several delta-rule programs read the same key head's q/k channels: updating a
window in place while another program still reads it would race. Rounding follows the reference: the conv's
products, sum and SiLU are rounded to the model dtype where torch rounds them; the delta rule runs in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ember.ops.gated_delta import ChunkPlan
from ember.ops.triton import pdl
from ember.ops.triton.pdl import release_dependents, wait_prior


@triton.jit
def _conv_step_kernel(x_ptr, w_ptr, state_ptr, out_ptr, read_ptr, write_ptr, num_channels,
                      stride_x, stride_w, stride_slot, stride_ch, stride_out,
                      KERNEL: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
                      USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    seq = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col = tl.arange(0, K_PAD)
    ch_mask = ch < num_channels
    dtype = w_ptr.dtype.element_ty  # the reference computes in the weight's dtype: round where it rounds
    read = tl.load(read_ptr + seq)
    write = tl.load(write_ptr + seq)
    x = tl.load(x_ptr + seq * stride_x + ch, mask=ch_mask, other=0.0).to(dtype).to(tl.float32)  # [BLOCK_C]
    # read < 0: the slot-0 loads below are replaced by zeros (a fresh sequence)
    src = state_ptr + tl.maximum(read, 0) * stride_slot + ch[:, None] * stride_ch
    # the window [state | x]: column j < KERNEL-1 from the slot, column KERNEL-1 is this token
    window = tl.load(src + col[None, :], mask=ch_mask[:, None] & (col[None, :] < KERNEL - 1), other=0.0)
    window = tl.where(read >= 0, window.to(dtype).to(tl.float32), 0.0)
    window = tl.where(col[None, :] == KERNEL - 1, x[:, None], window)
    w = tl.load(w_ptr + ch[:, None] * stride_w + col[None, :], mask=ch_mask[:, None] & (col[None, :] < KERNEL),
                other=0.0).to(tl.float32)
    acc = tl.sum((window * w).to(dtype).to(tl.float32), axis=1).to(dtype).to(tl.float32)  # [BLOCK_C]
    out = acc * tl.sigmoid(acc)
    # the new state is the window shifted by one: columns 1..KERNEL-1, read again from the slot
    shifted = tl.load(src + col[None, :] + 1, mask=ch_mask[:, None] & (col[None, :] + 1 < KERNEL - 1), other=0.0)
    shifted = tl.where(read >= 0, shifted.to(dtype).to(tl.float32), 0.0)
    shifted = tl.where(col[None, :] == KERNEL - 2, x[:, None], shifted)
    tl.debug_barrier()  # every thread's reads of the slot are done before any write (read may equal write)
    dst = state_ptr + write * stride_slot + ch[:, None] * stride_ch + col[None, :]
    tl.store(dst, shifted.to(state_ptr.dtype.element_ty), mask=ch_mask[:, None] & (col[None, :] < KERNEL - 1))
    tl.store(out_ptr + seq * stride_out + ch, out.to(out_ptr.dtype.element_ty), mask=ch_mask)


@triton.jit
def _delta_rule_step_kernel(x_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, rows_ptr, read_ptr, write_ptr, scale,
                            stride_x, stride_g, stride_beta, stride_slot, stride_out,
                            NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_K: tl.constexpr,
                            HEAD_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                            HAS_ROWS: tl.constexpr, WRITES: tl.constexpr, USE_PDL: tl.constexpr):
    wait_prior(USE_PDL)
    release_dependents(USE_PDL)
    seq = tl.program_id(0).to(tl.int64)
    if HAS_ROWS:  # the token of each program: rows_ptr's entry (-1: a spare one), else its own
        token = tl.load(rows_ptr + seq)
        if token < 0:
            return
    else:
        token = seq
    head = tl.program_id(1)
    kh = head // (NUM_V_HEADS // NUM_K_HEADS)  # each key head serves consecutive value heads
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask, v_mask = dk < HEAD_K, dv < HEAD_V
    read = tl.load(read_ptr + seq)
    row = x_ptr + token * stride_x
    q = tl.load(row + kh * HEAD_K + dk, mask=k_mask, other=0.0).to(tl.float32)
    k = tl.load(row + (NUM_K_HEADS + kh) * HEAD_K + dk, mask=k_mask, other=0.0).to(tl.float32)
    v = tl.load(row + 2 * NUM_K_HEADS * HEAD_K + head * HEAD_V + dv, mask=v_mask, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    decay = tl.exp(tl.load(g_ptr + token * stride_g + head).to(tl.float32))
    beta = tl.load(beta_ptr + token * stride_beta + head).to(tl.float32)
    tile = head * HEAD_K * HEAD_V + dk[:, None] * HEAD_V + dv[None, :]
    tile_mask = k_mask[:, None] & v_mask[None, :]
    s = tl.load(state_ptr + tl.maximum(read, 0) * stride_slot + tile, mask=tile_mask, other=0.0).to(tl.float32)
    s = tl.where(read >= 0, s, 0.0) * decay  # [BLOCK_K, BLOCK_V]; read < 0: a fresh sequence, zeros
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta  # v minus what the decayed state predicts for k
    s = s + k[:, None] * delta[None, :]
    out = tl.sum(s * q[:, None], axis=0)
    tl.debug_barrier()  # the tile is read before it is written (read may equal write)
    for j in tl.static_range(WRITES):  # write_ptr: [programs, WRITES] slots, -1 past a program's own
        write = tl.load(write_ptr + seq * WRITES + j)
        if write >= 0:
            tl.store(state_ptr + write * stride_slot + tile, s.to(state_ptr.dtype.element_ty), mask=tile_mask)
    tl.store(out_ptr + token * stride_out + head * HEAD_V + dv, out.to(out_ptr.dtype.element_ty), mask=v_mask)


def gated_delta_decode(mixed: torch.Tensor, conv_weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       conv_state: torch.Tensor, ssm_state: torch.Tensor, read_slots: torch.Tensor,
                       write_slots: torch.Tensor) -> torch.Tensor:
    num_seqs, conv_dim = mixed.shape
    num_v_heads, head_k, head_v = ssm_state.shape[1:]
    num_k_heads = (conv_dim - num_v_heads * head_v) // (2 * head_k)
    kernel = conv_weight.shape[1]
    assert 2 * num_k_heads * head_k + num_v_heads * head_v == conv_dim and num_v_heads % num_k_heads == 0
    assert conv_state.shape[1:] == (conv_dim, kernel - 1) and conv_state.stride(2) == 1 and kernel >= 2
    assert ssm_state.is_contiguous() and mixed.stride(1) == 1 and conv_weight.stride(1) == 1
    assert read_slots.shape == write_slots.shape == (num_seqs,) and g.stride(1) == 1 and beta.stride(1) == 1
    conv_out = torch.empty(num_seqs, conv_dim, dtype=mixed.dtype, device=mixed.device)
    core = torch.empty(num_seqs, num_v_heads, head_v, dtype=mixed.dtype, device=mixed.device)
    if num_seqs == 0:
        return core
    block_c = min(256, triton.next_power_of_2(conv_dim))
    _conv_step_kernel[(num_seqs, triton.cdiv(conv_dim, block_c))](
        mixed, conv_weight, conv_state, conv_out, read_slots, write_slots, conv_dim,
        mixed.stride(0), conv_weight.stride(0), conv_state.stride(0), conv_state.stride(1), conv_out.stride(0),
        KERNEL=kernel, K_PAD=triton.next_power_of_2(kernel), BLOCK_C=block_c, num_warps=4,
        **pdl.launch_args(mixed.device),
    )
    _delta_rule(conv_out, g, beta, ssm_state, core, None, read_slots, write_slots)
    return core


def step_rows(x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor, plan: ChunkPlan,
              out: torch.Tensor) -> None:
    """ember.ops.gated_delta.step_rows: a chunked step's sequences of one token through the delta rule kernel,
    one program per plan.step_rows entry (a captured plan's spare entries, -1, return at once)."""
    assert plan.step_slots.is_contiguous() and out.stride(2) == 1 and out.stride(1) == out.shape[2]
    if plan.step_rows.numel():
        _delta_rule(x, g, beta, states, out, plan.step_rows, plan.step_reads, plan.step_slots)


def _delta_rule(x, g, beta, states, out, rows, reads, writes) -> None:
    """The delta rule kernel over reads.shape[0] programs: token rows[i] (i where rows is None) of x [T, conv_dim]
    with g, beta [T, Hv], its state read from slot reads[i] and written into writes[i] ([n] or [n, K], -1 padding);
    its output into out[token] ([T, Hv, Dv])."""
    num_v_heads, head_k, head_v = states.shape[1:]
    num_k_heads = (x.shape[1] - num_v_heads * head_v) // (2 * head_k)
    assert states.is_contiguous() and x.stride(1) == 1 and g.stride(1) == 1 and beta.stride(1) == 1
    block_k = max(16, triton.next_power_of_2(head_k))
    block_v = min(max(16, triton.next_power_of_2(head_v)), 32 if block_k >= 128 else 64)
    _delta_rule_step_kernel[(reads.shape[0], num_v_heads, triton.cdiv(head_v, block_v))](
        x, g, beta, states, out, reads if rows is None else rows, reads, writes, head_k**-0.5,
        x.stride(0), g.stride(0), beta.stride(0), states.stride(0), out.stride(0),
        NUM_K_HEADS=num_k_heads, NUM_V_HEADS=num_v_heads, HEAD_K=head_k, HEAD_V=head_v,
        BLOCK_K=block_k, BLOCK_V=block_v, HAS_ROWS=rows is not None,
        WRITES=1 if writes.dim() == 1 else writes.shape[1], num_warps=4, **pdl.launch_args(x.device),
    )
