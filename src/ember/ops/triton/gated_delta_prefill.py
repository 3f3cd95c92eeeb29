"""The sequential part of the chunked gated delta rule (prefill), with the signature of the torch reference
ember.ops.gated_delta.chunk_scan: one launch runs every sequence's chunks in order, where the reference loops
over chunk steps on the host.

Grid (sequence, value head, Dv block); each program holds its [Dk, BLOCK_V] slice of the state in registers in
fp32 and, per chunk of its sequence (as flash-linear-attention's chunk_gated_delta_rule_fwd_h and chunk_fwd_o,
fused):
    v_new = u - w @ S;    o = q @ S + intra @ v_new;    S = S * decay + k^T @ v_new
storing o and, where the plan saves the state after the chunk, S. Everything the chunks need in parallel (the
UT transform, the masked intra-chunk products) is computed batched beforehand (ops.gated_delta.gated_delta_prefill).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ember.ops.gated_delta import ChunkPlan

# the dots' input precision: "ieee" (fp32 FMA, the reference's arithmetic), "tf32x3" or "tf32" (tensor cores)
PRECISION = os.environ.get("EMBER_DELTA_SCAN_PRECISION", "ieee")


@triton.jit
def _chunk_scan_kernel(w_ptr, u_ptr, q_ptr, k_ptr, a_ptr, decay_ptr, h0_ptr, out_ptr, saved_ptr, starts_ptr,
                       save_ptr, num_heads,
                       HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_V: tl.constexpr, PRECISION: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    c = tl.arange(0, CHUNK)
    k_mask, v_mask = dk < HEAD_K, dv < HEAD_V
    state_tile = dk[:, None] * HEAD_V + dv[None, :]
    state_mask = k_mask[:, None] & v_mask[None, :]
    h = tl.load(h0_ptr + (seq * num_heads + head).to(tl.int64) * HEAD_K * HEAD_V + state_tile, mask=state_mask,
                other=0.0)
    first = tl.load(starts_ptr + seq)
    last = tl.load(starts_ptr + seq + 1)
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
        tl.store(out_ptr + rows_v, o, mask=v_mask[None, :])
        k = tl.load(k_ptr + rows_k, mask=k_mask[None, :], other=0.0)
        decay = tl.load(decay_ptr + n * num_heads + head)
        h = h * decay + tl.dot(tl.trans(k), v_new, input_precision=PRECISION)
        row = tl.load(save_ptr + n)
        if row >= 0:
            tl.store(saved_ptr + (row * num_heads + head).to(tl.int64) * HEAD_K * HEAD_V + state_tile, h,
                     mask=state_mask)


def chunk_scan(w: torch.Tensor, u: torch.Tensor, q: torch.Tensor, k: torch.Tensor, intra: torch.Tensor,
               chunk_decay: torch.Tensor, initial: torch.Tensor, plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    num_chunks, num_heads, chunk, head_k = w.shape
    head_v = u.shape[-1]
    for x in (w, u, q, k, intra, chunk_decay, initial):
        assert x.is_contiguous() and x.dtype == torch.float32
    assert u.shape == (num_chunks, num_heads, chunk, head_v) and intra.shape == (num_chunks, num_heads, chunk, chunk)
    assert chunk >= 16 and chunk == triton.next_power_of_2(chunk), "tl.dot needs a power-of-two chunk of >= 16"
    num_seqs = initial.shape[0]
    out = torch.empty_like(u)
    saved = initial.new_empty(plan.num_rows, num_heads, head_k, head_v)
    if num_chunks == 0 or num_seqs == 0:
        return out, saved
    block_k = max(16, triton.next_power_of_2(head_k))
    block_v = min(32, max(16, triton.next_power_of_2(head_v)))
    _chunk_scan_kernel[(num_seqs, num_heads, triton.cdiv(head_v, block_v))](
        w, u, q, k, intra, chunk_decay, initial, out, saved, plan.seq_chunks, plan.save_after, num_heads,
        HEAD_K=head_k, HEAD_V=head_v, CHUNK=chunk, BLOCK_K=block_k, BLOCK_V=block_v, PRECISION=PRECISION,
        num_warps=4,
    )
    return out, saved
