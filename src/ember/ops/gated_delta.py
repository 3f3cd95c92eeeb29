"""Reference (torch) ops of Gated DeltaNet layers (Yang et al., "Gated Delta Networks", arXiv:2412.06464), as
transformers' Qwen3.5 implements them: the chunked gated delta rule for prefill (batched over every chunk of
every sequence of a step), its single-step recurrent form for decode, and the short causal depthwise convolution
with a carried state. The CPU path and the GPU oracle.

Per head, with state S [Dk, Dv], decay a_t = exp(g_t) and write strength beta_t:
    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T,    o_t = S_t^T q_t
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor,
                       conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. x: [B, C]; conv_state: [B, C, K-1] -> ([B, C] outputs, [B, C, K-1] new states)."""
    window = torch.cat([conv_state.to(weight.dtype), x[:, :, None].to(weight.dtype)], dim=-1)  # [B, C, K]
    out = (window * weight[None]).sum(-1)
    return F.silu(out).to(x.dtype), window[:, :, 1:]


def _prepare(q, k, v, beta, g):
    # q, k: [..., H, Dk] (already one per value head), v: [..., H, Dv]; everything in fp32 as transformers does
    # (float64 stays float64: the benchmarks' oracle)
    q, k, v, beta, g = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, v, beta, g))
    q, k = l2norm(q), l2norm(k)
    q = q * q.shape[-1] ** -0.5
    return q, k, v, beta, g


@dataclass(slots=True)
class ChunkLayout:
    """A step's chunk layout on the host (numpy, int64): what ChunkPlan holds on the device, built once; the
    graph runner writes it into a captured plan's static buffers (padded to their sizes) instead."""

    width: int
    chunk_size: int
    num_rows: int
    seq_chunks: np.ndarray  # [S+1]
    save_after: np.ndarray  # [N]
    chunk_first: np.ndarray  # [N]
    chunk_len: np.ndarray  # [N]
    initial_saves: list[tuple[int, int]]
    save_slots: np.ndarray  # [M]
    save_cols: np.ndarray  # [M, width]
    row_slots: np.ndarray  # [num_rows, K] the slots each saved row goes into, -1 past its own
    reads: np.ndarray  # [S] as given (-1: fresh)
    token_pos: np.ndarray  # [T] (-1: a token the recurrent step takes)
    token_cols: np.ndarray  # [T]
    state_cols: np.ndarray  # [S, width]
    buffer_starts: np.ndarray  # [S+1]
    step_rows: np.ndarray  # [D] the token of each sequence the recurrent step takes
    step_reads: np.ndarray  # [D] its read slot (-1: fresh)
    step_slots: np.ndarray  # [D, K] the slots its state goes into, -1 past its own
    scan_seqs: np.ndarray  # [S'] the sequences with chunks

    @property
    def num_chunks(self) -> int:
        return len(self.save_after)

    @classmethod
    def build(cls, query_start_loc: Sequence[int], read_slots: Sequence[int], write_slots: Sequence[int],
              snapshots: Sequence[tuple[tuple[int, int], ...]], width: int, chunk_size: int = 64) -> ChunkLayout:
        seq_chunks, save_after, initial_saves, chunk_first, chunk_len = [0], [], [], [], []
        save_slots, save_cols, token_pos, token_cols, row_slots = [], [], [], [], []
        step_rows, step_reads, step_slots = [], [], []
        num_rows = 0
        qsl = np.asarray(query_start_loc, dtype=np.int64)
        lengths = np.diff(qsl)
        buffer_starts = np.concatenate([[0], np.cumsum(lengths + width)])
        window = np.arange(width, dtype=np.int64)
        for i, (start, length, buffer) in enumerate(zip(qsl[:-1].tolist(), lengths.tolist(), buffer_starts.tolist())):
            if length == 0:  # a sequence with no tokens this step keeps its slots as they are
                seq_chunks.append(len(save_after))
                continue
            token_cols.append(np.arange(buffer + width, buffer + width + length))
            due: dict[int, list[int]] = {}
            for offset, slot in snapshots[i]:
                due.setdefault(offset, []).append(slot)
            due.setdefault(length, []).append(write_slots[i])
            for cut in sorted(due):  # the conv windows due, whichever rule takes the tokens
                save_slots.extend(due[cut])
                save_cols.extend(buffer + cut + window for _ in due[cut])
            if takes_step(length, due):
                token_pos.append(np.array([-1]))
                step_rows.append(start)
                step_reads.append(read_slots[i])
                step_slots.append(due[1])
                seq_chunks.append(len(save_after))
                continue
            begin = 0
            for cut in sorted(due):
                pieces = -(-(cut - begin) // chunk_size)
                token_pos.append(len(save_after) * chunk_size + np.arange(cut - begin))
                chunk_first.extend(range(start + begin, start + cut, chunk_size))
                chunk_len.extend(min(chunk_size, cut - b) for b in range(begin, cut, chunk_size))
                save_after.extend([-1] * pieces)
                if pieces:
                    save_after[-1] = num_rows
                else:
                    initial_saves.extend((slot, i) for slot in due[cut])
                row_slots.append(due[cut])
                num_rows += 1
                begin = cut
            seq_chunks.append(len(save_after))

        def arr(x, shape=(0,)):
            return np.asarray(x, dtype=np.int64) if len(x) else np.empty(shape, dtype=np.int64)

        def cat(parts):
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

        return cls(width, chunk_size, num_rows, arr(seq_chunks), arr(save_after), arr(chunk_first), arr(chunk_len),
                   initial_saves, arr(save_slots), arr(save_cols, (0, width)), padded_rows(row_slots),
                   arr(read_slots), cat(token_pos), cat(token_cols), buffer_starts[:-1, None] + window, buffer_starts,
                   arr(step_rows), arr(step_reads), padded_rows(step_slots),
                   np.flatnonzero(np.diff(seq_chunks)).astype(np.int64))


def takes_step(length: int, due: Iterable[int]) -> bool:
    """Whether a sequence's tokens this step go through the recurrent step instead of a chunk: one token, with
    states due (the offsets into the step's tokens) only after it. A decode row of a mixed step is one; a chunk
    would spend a 64-token chunk's work (the prepare kernel's triangular inverse, the scan's tiles) on it."""
    return length == 1 and all(offset == 1 for offset in due)


def padded_rows(rows: list[list[int]]) -> np.ndarray:
    """Lists of slots -> [len(rows), K] int64, -1 past each list's own."""
    out = np.full((len(rows), max(map(len, rows), default=1)), -1, dtype=np.int64)
    for r, slots in enumerate(rows):
        out[r, : len(slots)] = slots
    return out


@dataclass(slots=True)
class ChunkPlan:
    """Where one prefill step's tokens go in the batched (varlen) chunked form; built on the host once per step
    and shared by the step's Gated DeltaNet layers.

    Each sequence's tokens are cut where a state is due (a snapshot, the end), and each piece is padded to whole
    chunks: chunks never straddle a cut, so the state at every cut is a chunk's end state (a "saved row").
    Padding tokens have k = v = beta = g = 0 and leave the state unchanged. A sequence of one token with its
    states due after it (takes_step: a decode row of a mixed step) has no chunk: the recurrent step takes it
    (step_rows). The conv runs over one buffer that holds, per sequence, its K-1 inputs before the chunk and then
    its tokens.
    """

    chunk_size: int
    width: int  # the conv window kept as state: K - 1
    num_chunks: int
    num_rows: int  # saved rows: one per cut
    seq_chunks_cpu: list[int]  # [S+1] chunk range of each sequence
    seq_chunks: torch.Tensor  # the same, int32 on the device
    save_after_cpu: list[int]  # [N] saved row taking the state after this chunk, or -1
    save_after: torch.Tensor  # the same, int32 on the device
    # (slot, sequence): a state due before the sequence's first token (a cut at offset 0) is its initial state
    initial_saves: list[tuple[int, int]]
    save_slots: torch.Tensor  # [M] int64 slot of each due state (snapshots, working slots), distinct; -1: spare
    save_cols: torch.Tensor  # [M, width] conv buffer rows of each slot's window
    row_slots: torch.Tensor  # [num_rows, K] int64 the slots of each saved row (the scan writes them), -1 padding
    reads: torch.Tensor  # [S] int64 slot of each sequence's state before the chunk (clamped to >= 0)
    fresh: torch.Tensor  # [S, 1, 1] bool: starts from zeros (read < 0)
    token_pos: torch.Tensor  # [T] int64 padded position (chunk * chunk_size + offset) of each token, -1: none
    chunk_first: torch.Tensor  # [N] int32 the first token of each chunk
    chunk_len: torch.Tensor  # [N] int32 its number of tokens (<= chunk_size)
    buffer_len: int
    buffer_starts_cpu: list[int]  # [S+1] each sequence's rows of the conv buffer: K-1 window rows, then its tokens
    token_cols: torch.Tensor  # [T] conv buffer row of each token
    state_cols: torch.Tensor  # [S, width] conv buffer rows of each sequence's window before the chunk
    step_rows: torch.Tensor  # [D] int64 the token of each sequence the recurrent step takes (-1: a spare entry)
    step_reads: torch.Tensor  # [D] int64 its read slot (-1: fresh)
    step_slots: torch.Tensor  # [D, K] int64 the slots its state goes into, -1 padding
    scan_seqs: torch.Tensor  # [S'] int32 the sequences with chunks (the scan's programs; -1: a spare entry)

    @classmethod
    def build(cls, query_start_loc: Sequence[int], read_slots: Sequence[int], write_slots: Sequence[int],
              snapshots: Sequence[tuple[tuple[int, int], ...]], width: int, device: torch.device,
              chunk_size: int = 64) -> ChunkPlan:
        return cls.from_layout(ChunkLayout.build(query_start_loc, read_slots, write_slots, snapshots, width,
                                                 chunk_size), device)

    @classmethod
    def from_layout(cls, lay: ChunkLayout, device: torch.device) -> ChunkPlan:
        def dev(x, dtype=torch.int64):
            return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype, non_blocking=True)

        return cls(lay.chunk_size, lay.width, lay.num_chunks, lay.num_rows, lay.seq_chunks.tolist(),
                   dev(lay.seq_chunks, torch.int32), lay.save_after.tolist(), dev(lay.save_after, torch.int32),
                   lay.initial_saves, dev(lay.save_slots), dev(lay.save_cols), dev(lay.row_slots),
                   dev(np.maximum(lay.reads, 0)), dev(lay.reads < 0, torch.bool)[:, None, None], dev(lay.token_pos),
                   dev(lay.chunk_first, torch.int32), dev(lay.chunk_len, torch.int32), int(lay.buffer_starts[-1]),
                   lay.buffer_starts.tolist(), dev(lay.token_cols), dev(lay.state_cols), dev(lay.step_rows),
                   dev(lay.step_reads), dev(lay.step_slots), dev(lay.scan_seqs, torch.int32))


def conv_windows(buf: torch.Tensor, weight: torch.Tensor, plan: ChunkPlan, out_dtype: torch.dtype,
                 conv_state: torch.Tensor, per_sequence: bool | None = None) -> torch.Tensor:
    """SiLU of the depthwise conv of each token's window: buf [buffer_len, C] (varlen_causal_conv1d's, holding
    the tokens), weight [C, K] -> [T, C] in out_dtype, token t's window being buffer rows plan.token_cols[t] - (K-1)
    .. token_cols[t]. First each sequence's window before its first token is filled in (buffer rows
    plan.state_cols) from its read slot of conv_state [num_slots, C, K-1] (plan.reads; zeros where plan.fresh);
    last the windows due (buffer rows plan.save_cols) are written into their slots (plan.save_slots; -1: a captured
    plan's spare entry). per_sequence: one conv per sequence (the default on CPU, where each conv's inputs stay in
    cache) or one over the whole buffer."""
    buf[plan.state_cols] = conv_state[plan.reads].masked_fill(plan.fresh, 0).to(buf.dtype).transpose(1, 2)
    due = plan.save_slots >= 0
    conv_state.index_copy_(0, plan.save_slots[due], buf[plan.save_cols[due]].transpose(1, 2).to(conv_state.dtype))
    channels, width = weight.shape[0], plan.width
    if not (per_sequence if per_sequence is not None else not buf.is_cuda):
        # one conv over the whole buffer; column j of its output is the window ending at row j + K-1
        out = F.conv1d(buf.t().contiguous()[None], weight[:, None, :], groups=channels)[0]
        out = out.t().contiguous()[plan.token_cols - width]
    else:  # the same windows, the same sums
        out = buf.new_empty(plan.token_cols.shape[0], channels)
        token = 0
        for a, b in zip(plan.buffer_starts_cpu[:-1], plan.buffer_starts_cpu[1:]):
            if b - a > width:
                seq = F.conv1d(buf[a:b].t()[None], weight[:, None, :], groups=channels)[0]
                out[token:token + b - a - width] = seq.t()
                token += b - a - width
    return F.silu(out).to(out_dtype)


def varlen_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, plan: ChunkPlan,
                         windows=conv_windows) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over a step's sequences at once. x: [T, C] the tokens; weight: [C, K];
    conv_state: [num_slots, C, K-1] read at plan.reads (zeros where fresh), then the windows due written into
    their slots (plan.save_slots). Returns ([T, C] outputs, the [buffer_len, C] inputs buffer). `windows`:
    conv_windows (the default) or a kernel with its signature, which also moves the windows between the buffer
    and conv_state."""
    channels = weight.shape[0]
    buf = x.new_empty(plan.buffer_len, channels, dtype=weight.dtype)  # token-major: row scatters and gathers
    buf[plan.token_cols] = x.to(weight.dtype)
    return windows(buf, weight, plan, x.dtype, conv_state), buf


def initial_states(states: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
    """[S, H, Dk, Dv] fp32: each sequence's state before the step, read from the slots plan.reads names (zeros where
    plan.fresh)."""
    return states[plan.reads].float().masked_fill(plan.fresh[..., None], 0)


def states_due_first(states: torch.Tensor, plan: ChunkPlan) -> list[tuple[int, torch.Tensor]]:
    """(slot, state) of each state due before a sequence's first token (its initial state), read before a scan
    writes any slot; write_states puts them in place after it."""
    if not plan.initial_saves:
        return []
    initial = initial_states(states, plan)
    return [(slot, initial[seq]) for slot, seq in plan.initial_saves]


def write_states(states: torch.Tensor, due: list[tuple[int, torch.Tensor]]) -> None:
    for slot, state in due:
        states[slot] = state.to(states.dtype)


def chunk_scan(w: torch.Tensor, u: torch.Tensor, q: torch.Tensor, k: torch.Tensor, intra: torch.Tensor,
               chunk_decay: torch.Tensor, states: torch.Tensor, plan: ChunkPlan,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The sequential part of the chunked rule: each sequence's chunks in order, carrying its state.

    w (the decayed keys through the UT transform), q (decayed queries), k (keys decayed to the chunk end):
    [N, H, C, Dk]; u (the chunk's new values): [N, H, C, Dv]; intra (masked, decayed q k^T): [N, H, C, C];
    chunk_decay: [N, H]; states: [num_slots, H, Dk, Dv], each sequence's initial state read at plan.reads (zeros
    where plan.fresh; computed in fp32). Returns [T, H, Dv] the outputs in token order, in out_dtype (default: u's;
    the rows of tokens the recurrent step takes are left to it, step_rows), and writes the states due into their
    slots of `states`: the state after each chunk plan.save_after names into its row's slots (plan.row_slots), a
    sequence's initial state into slots due before its first token. Every slot is read before any is written.
    Step i runs chunk i of every sequence that has one.
    """
    out = torch.empty_like(u)
    due_first = states_due_first(states, plan)
    initial = initial_states(states, plan)
    saved = initial.new_empty(plan.num_rows, *initial.shape[1:])
    starts = plan.seq_chunks_cpu
    counts = [b - a for a, b in zip(starts[:-1], starts[1:])]
    state = initial  # a fresh tensor: carried in place
    for i in range(max(counts, default=0)):
        seqs = [s for s, n in enumerate(counts) if n > i]
        chunks = [starts[s] + i for s in seqs]
        si, ci = (torch.tensor(x, device=u.device) for x in (seqs, chunks))
        h = state[si]
        v_new = u[ci] - w[ci] @ h
        out[ci] = q[ci] @ h + intra[ci] @ v_new
        h = h * chunk_decay[ci][..., None, None] + k[ci].transpose(-1, -2) @ v_new
        state[si] = h
        for j, c in enumerate(chunks):
            if plan.save_after_cpu[c] >= 0:
                saved[plan.save_after_cpu[c]] = h[j]
    out = out.transpose(1, 2).reshape(-1, *out.shape[1::2])  # [N, H, C, Dv] -> [N * C, H, Dv]
    out = torch.cat([out, out.new_zeros(1, *out.shape[1:])])[plan.token_pos]  # token order; position -1: zeros
    # rows of states due first are not written here: write_states overwrites them
    slots = plan.row_slots.flatten()
    rows = torch.arange(plan.num_rows, device=slots.device).repeat_interleave(plan.row_slots.shape[1])
    states.index_copy_(0, slots[slots >= 0], saved[rows[slots >= 0]].to(states.dtype))
    write_states(states, due_first)
    return out.to(out_dtype or out.dtype)


def chunk_prepare(x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, plan: ChunkPlan, num_k_heads: int,
                  head_k: int, head_v: int) -> tuple[torch.Tensor, ...]:
    """The parallel part of the chunked rule, every chunk at once: per chunk and value head the l2-normed q/k,
    the cumulative log decay, the UT transform's triangular solves and the masked intra-chunk q k^T, each as
    transformers' torch_chunk_gated_delta_rule computes it for a chunk.

    x: [T, conv_dim] the conv outputs (q, k, v heads); g (log decay), beta: [T, Hv]. Returns chunk_scan's inputs
    (w, u, q, k, intra, chunk_decay), contiguous float32 [N, Hv, C, ...] (zeros where a chunk has no token).
    """
    num_v_heads, size = g.shape[-1], plan.chunk_size
    q, k, v = split_heads(x, num_k_heads, head_k, num_v_heads, head_v)
    q, k, v, beta, g = _prepare(q, k, v, beta, g)

    def chunks(t):  # [T, H, ...] -> [N, H, C, ...], zeros where no token is
        padded = t.new_zeros(plan.num_chunks * size + 1, *t.shape[1:])  # the last row: tokens at position -1
        padded[plan.token_pos] = t
        return padded[:-1].reshape(plan.num_chunks, size, *t.shape[1:]).transpose(1, 2).contiguous()

    v_beta, k_beta = chunks(v * beta[..., None]), chunks(k * beta[..., None])
    q, k, g = chunks(q), chunks(k), chunks(g).cumsum(-1)  # g: [N, H, C] cumulative log decay within a chunk
    upper = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [N, H, C, C]
    ut_system = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    # solve (I + strictly_lower(ut_system)) X = rhs: the UT transform condensing the chunk's delta-rule updates
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    q = q * g.exp()[..., None]
    k = k * (g[..., -1:] - g).exp()[..., None]
    return tuple(t.contiguous() for t in (k_cumdecay, new_values, q, k, intra, g[..., -1].exp()))


def _delta_rule_rows(x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                     reads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule step of one token per row: x [B, conv_dim] the conv outputs (q, k, v heads), g, beta
    [B, Hv], each row's state read from slot reads[b] of states (zeros where < 0) -> ([B, Hv, Dv] in x's dtype,
    the new fp32 states [B, Hv, Dk, Dv])."""
    num_v_heads, head_k, head_v = states.shape[1:]
    num_k_heads = (x.shape[1] - num_v_heads * head_v) // (2 * head_k)
    initial = states[reads.clamp(min=0)].masked_fill((reads < 0)[:, None, None, None], 0)
    return recurrent_gated_delta_step(*split_heads(x, num_k_heads, head_k, num_v_heads, head_v), g, beta, initial)


def step_rows(x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor, plan: ChunkPlan,
              out: torch.Tensor) -> None:
    """The sequences of one token in a chunked step (plan.step_rows: a mixed step's decode rows, takes_step)
    through the recurrent rule instead of a chunk: x [T, conv_dim] the step's conv outputs, g, beta [T, Hv]; each
    state read from its slot (plan.step_reads, zeros where < 0) and the new one written into its slots
    (plan.step_slots), its output into its row of out [T, Hv, Dv]."""
    keep = plan.step_rows >= 0  # a captured plan's spare entries are -1
    rows, slots = plan.step_rows[keep], plan.step_slots[keep]
    core, new = _delta_rule_rows(x[rows], g[rows], beta[rows], states, plan.step_reads[keep])
    for j in range(slots.shape[1]):
        due = slots[:, j] >= 0
        states.index_copy_(0, slots[due, j], new[due].to(states.dtype))
    out[rows] = core.to(out.dtype)


def gated_delta_prefill(mixed: torch.Tensor, conv_weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        conv_state: torch.Tensor, ssm_state: torch.Tensor, plan: ChunkPlan, num_k_heads: int,
                        prepare=chunk_prepare, scan=chunk_scan, windows=conv_windows, step=step_rows) -> torch.Tensor:
    """A prefill step's tokens (any number of sequences) through a Gated DeltaNet layer: the causal conv + SiLU,
    the q/k/v heads and the chunked (WY / UT-transform) gated delta rule, batched over every chunk of every
    sequence (`prepare`: chunk_prepare or a kernel with its signature; `windows`: the conv's, conv_windows or a
    kernel); only `scan` (chunk_scan, or a kernel) runs the chunks in order, and `step` (step_rows, or a kernel)
    takes the sequences of one token (a mixed step's decode rows) through the recurrent rule. States start from
    the slots plan.reads names (zeros where fresh) and the states due (snapshots, each sequence's working slot)
    are written into their slots.

    mixed: [T, conv_dim] the q/k/v projection; conv_weight: [conv_dim, K]; g (log decay), beta: [T, Hv];
    conv_state: [num_slots, conv_dim, K-1]; ssm_state: [num_slots, Hv, Dk, Dv] fp32. Returns [T, Hv, Dv] in
    mixed's dtype. Every read happens before any write, so a sequence may read and write one slot.
    """
    num_v_heads, head_k, head_v = ssm_state.shape[1:]
    conv_out, _ = varlen_causal_conv1d(mixed, conv_weight, conv_state, plan, windows=windows)
    out = scan(*prepare(conv_out, g, beta, plan, num_k_heads, head_k, head_v), ssm_state, plan,
               out_dtype=mixed.dtype)
    step(conv_out, g, beta, ssm_state, plan, out)  # after the scan read every initial state
    return out


def recurrent_gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                               state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence, as transformers' torch_recurrent_gated_delta_rule.

    q, k: [B, H, Dk]; v: [B, H, Dv]; g, beta: [B, H]; state: [B, H, Dk, Dv] fp32 -> ([B, H, Dv], new state).
    """
    out_dtype = v.dtype
    q, k, v, beta, g = _prepare(q, k, v, beta, g)
    state = state.float() * g.exp()[..., None, None]
    kv_mem = (state * k[..., None]).sum(-2)  # [B, H, Dv]: what the decayed state predicts for k
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    out = (state * q[..., None]).sum(-2)
    return out.to(out_dtype), state


def split_heads(x: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int,
                head_v_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, conv_dim] -> q, k [N, Hv, Dk] (each key head serves Hv/Hk consecutive value heads), v [N, Hv, Dv]."""
    key_dim = num_k_heads * head_k_dim
    q, k, v = x.split([key_dim, key_dim, num_v_heads * head_v_dim], dim=-1)
    rep = num_v_heads // num_k_heads
    q = q.reshape(-1, num_k_heads, head_k_dim).repeat_interleave(rep, dim=1)
    k = k.reshape(-1, num_k_heads, head_k_dim).repeat_interleave(rep, dim=1)
    return q, k, v.reshape(-1, num_v_heads, head_v_dim)


def gated_delta_decode(mixed: torch.Tensor, conv_weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       conv_state: torch.Tensor, ssm_state: torch.Tensor, read_slots: torch.Tensor,
                       write_slots: torch.Tensor) -> torch.Tensor:
    """One decode token per sequence through a Gated DeltaNet layer's state slots: conv1d step + SiLU, q/k/v heads,
    the gated delta rule step, and the new conv window and recurrent state written into the slots in place.

    mixed: [B, conv_dim] the q/k/v projection; conv_weight: [conv_dim, K]; g (log decay, fp32), beta: [B, Hv];
    conv_state: [num_slots, conv_dim, K-1]; ssm_state: [num_slots, Hv, Dk, Dv] fp32; read_slots, write_slots: [B]
    int64 device tensors (read < 0: start from zeros). Returns the core output [B, Hv, Dv] in mixed's dtype.
    Reads all happen before writes, so a sequence may read and write the same slot.
    """
    is_fresh = (read_slots < 0)[:, None, None]  # a one-token prompt starts from zeros
    conv_in = conv_state[read_slots.clamp(min=0)].masked_fill(is_fresh, 0)
    out, conv_new = causal_conv1d_step(mixed, conv_weight, conv_in)
    core, ssm_new = _delta_rule_rows(out, g, beta, ssm_state, read_slots)
    conv_state.index_copy_(0, write_slots, conv_new.to(conv_state.dtype))
    ssm_state.index_copy_(0, write_slots, ssm_new.to(ssm_state.dtype))
    return core

