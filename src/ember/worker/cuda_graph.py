"""CUDA graphs of decode and mixed steps: the model forward and the logits of its sampled rows, captured once per
padded size, replayed with new inputs copied into static buffers.

A step launches ~10 kernels per layer; eagerly the host cannot issue them as fast as the GPU runs them (on an H100
a 128-token prompt of qwen3-0.6b took 16 ms of launches for 1.3 ms of kernels), replayed from a graph it issues
them all at once.

Decode steps (one query token per sequence) are captured per batch size b. Padding rows (batch n padded to b)
write their KV into slot 0 of block 0 of every KV group's pool (the reserved scratch block) and their recurrent
state into the state cache's scratch slot, reading zeros; their logits are dropped.

Mixed steps (prompt chunks, with or without decodes) of up to t tokens are captured per token count t, with
min(t, max_num_seqs) sequence slots and one more for the padding. The step's sequences come first; the padding
sequence owns the rows from the step's last token to t (token 0 at position 0, KV into the scratch slot, keys read
from the scratch block) and the remaining slots hold no queries, so their attention programs return at once.
The prefill kernel reads query starts, sequence lengths and block tables on the device; for a captured step
(AttentionMetadata.captured) its grid runs over the step's query tiles, each program finding its sequence there.
The host lists of a captured step's metadata only give the slots' shape: nothing is routed by them (no leading
one-token sequences split off, no flash attention: every t stays below FLASH_PREFILL_MIN_QUERY). For models with
recurrent state the padding sequence is a fresh one writing the scratch slot, and the recurrent layers' chunk plan
(built on the host per step, as eagerly) is copied into static buffers sized for t (StaticChunkPlans).

The attention kernels read sequence lengths and block tables on the device, the recurrent layers their state
slots, so one graph serves any step of its size. Hybrid models get static buffers for each extra KV group's slot
mapping and block table and for the state slots.
"""
from __future__ import annotations

import bisect
import itertools
import os
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ember.engine.scheduler import ScheduledSeq
from ember.ops.gated_delta import ChunkLayout, ChunkPlan, takes_step
from ember.worker.attn_metadata import AttentionMetadata, padded_tables, step_positions, token_slots
from ember.worker.state_cache import StateMetadata


def _sizes_from_env(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A comma-separated list of ascending positive sizes from the environment variable name, else default."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if sizes[0] < 1 or any(a >= b for a, b in itertools.pairwise(sizes)):
        raise ValueError(f"{name}={text!r}: the sizes must be positive and ascending")
    return sizes


# batch sizes of the captured decode steps (EMBER_GRAPH_BATCH_SIZES), the largest the most sequences a graph takes:
# 8 apart to 64, 16 apart above, as a padded batch computes its padding rows too. On an H200 (NOTES v23) cuBLAS's
# GEMMs of qwen3-8b grow steadily with the rows from 128 on (a layer's four: 129 us at 144 rows, 151 at 192), and
# 136 sequences decoded 7.23 ms per step padded to 144 against 7.73 padded to 192; capture took 0.5 s longer
GRAPH_BATCH_SIZES = _sizes_from_env("EMBER_GRAPH_BATCH_SIZES", (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112,
                                                                128, 144, 160, 176, 192, 208, 224, 240, 256))
# token counts of the captured mixed steps (EMBER_GRAPH_TOKEN_SIZES; below the flash-attention threshold, within the
# token budget): at most 1.5x apart, 1.25x from 256 on, where a step is compute-bound and pays for its padding in
# full (qwen3-8b's four GEMMs of a layer on an H200: 313 us at 576 rows, 415 at 768)
GRAPH_TOKEN_SIZES = _sizes_from_env("EMBER_GRAPH_TOKEN_SIZES", (16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512,
                                                                640, 768, 896, 1024))
# sequence slots of a mixed graph of a model with recurrent state (StaticChunkPlans; EMBER_STATE_MIXED_SEQS), at most
# t per t-token graph: a slot costs a conv window gathered and a recurrent-step program that returns at once where the
# slot is empty. On an H100 (qwen3_5-default, NOTES v22) 256 rather than 64 cost a lone 128-token prompt ~0.5 ms
# (11.4 -> 11.9 ms: its graph has 128 slots) and took 256 sequences' continuous admission from 7,600 to 8,170 tok/s
# (steps of more than 64 sequences were eager: 36.5 ms for 255 decodes and a prompt, 27.6 graphed); since the conv
# windows are copied by one kernel (NOTES v23) a slot costs less: on an H200 a lone prompt 10.28 -> 9.72 ms
STATE_MIXED_SEQS = int(os.environ.get("EMBER_STATE_MIXED_SEQS", "256"))
# of those, the most that run chunks (prompt chunks; decode rows take the recurrent step), the padding sequence
# counted (EMBER_STATE_MIXED_CHUNKED): each adds a chunk of room (qwen3_5-default: 4.7 MB of the prepare kernel's
# outputs) and a scan program per head and Dv block; steps with more run eagerly
STATE_MIXED_CHUNKED = int(os.environ.get("EMBER_STATE_MIXED_CHUNKED", "32"))

# (input_ids, seqs, ends): writes tokens still on the device (async scheduling's placeholders) into input_ids
FillPlaceholders = Callable[[torch.Tensor, list[ScheduledSeq], Sequence[int]], None]


def _host(shape: tuple[int, ...], dtype: torch.dtype, is_pinned: bool) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=is_pinned)


class StaticChunkPlans:
    """The chunk plans (ops.gated_delta.ChunkPlan) of the mixed graphs of a model with recurrent state, in static
    buffers. The graph of t tokens plans its slots(t) sequence slots: the step's sequences, the padding sequence
    (fresh, writing the scratch slot) and empty ones; chunked(t) of them may run chunks (the rest are decode rows,
    which the recurrent step takes: ops.gated_delta.takes_step). It has room for chunks(t) = t / 64 + chunked(t) + 2
    chunks, 2 cuts per slot (a snapshot and the chunk's end) of 2 slots each, 2 conv saves and a recurrent step per
    slot. A step's host layout (ChunkLayout) is copied in padded: chunks past its own hold no tokens (no
    sequence's range reaches them; the prepare kernel returns at once), rows past its own name no slot, conv saves
    past its own name no slot, spare scan and recurrent-step entries name no sequence or token (their
    programs return at once). Steps that need more chunks or chunked sequences, or a state saved before their
    first token, run eagerly (fits)."""

    def __init__(self, slots: dict[int, int], width: int, scratch_slot: int, device: torch.device,
                 is_pinned: bool, chunked: int = STATE_MIXED_CHUNKED, chunk_size: int = 64) -> None:
        self.width, self.scratch_slot, self.chunk_size = width, scratch_slot, chunk_size
        self.slots = slots  # per token count, the padding sequence's slot counted
        self.chunked = {t: min(s, chunked) for t, s in slots.items()}  # the padding sequence counted
        self.chunks = {t: -(-t // chunk_size) + self.chunked[t] + 2 for t in slots}
        sizes = {k: max(self._sizes(t)[k] for t in slots) for k in self._sizes(max(slots))}
        dtypes = {"seq_chunks": torch.int32, "save_after": torch.int32, "chunk_first": torch.int32,
                  "chunk_len": torch.int32, "fresh": torch.bool, "scan_seqs": torch.int32}
        self.dev = {k: torch.zeros(n, dtype=dtypes.get(k, torch.int64), device=device) for k, n in sizes.items()}
        self.host = {k: _host((n,), dtypes.get(k, torch.int64), is_pinned) for k, n in sizes.items()}
        # until the first step, an empty plan for every t: no sequence has chunks, no state is saved,
        # and the conv reads whole windows (a token's buffer row is at least K - 1)
        self.dev["save_slots"].fill_(-1)
        self.dev["row_slots"].fill_(-1)
        self.dev["step_rows"].fill_(-1)
        self.dev["scan_seqs"].fill_(-1)
        self.dev["token_cols"].fill_(width)
        self.plans = {t: self._plan(t) for t in slots}

    def _sizes(self, t: int) -> dict[str, int]:
        s, n, w = self.slots[t], self.chunks[t], self.width
        return {"token_pos": t, "token_cols": t, "reads": s, "save_slots": 2 * s, "save_cols": 2 * s * w,
                "row_slots": 2 * (2 * s + 1), "state_cols": s * w, "seq_chunks": s + 1, "save_after": n,
                "chunk_first": n, "chunk_len": n, "fresh": s, "step_rows": s, "step_reads": s, "step_slots": 2 * s,
                "scan_seqs": self.chunked[t]}

    def _plan(self, t: int, lay: ChunkLayout | None = None) -> ChunkPlan:
        """Graph t's plan over the static buffers; its host lists from lay (use_graphs=False: the reference ops
        loop over them) or, captured, of the right length only."""
        s, n, w = self.slots[t], self.chunks[t], self.width
        d = {k: self.dev[k][:size] for k, size in self._sizes(t).items()}
        return ChunkPlan(
            self.chunk_size, w, n, 2 * s + 1, lay.seq_chunks.tolist() if lay else [0] * (s + 1), d["seq_chunks"],
            lay.save_after.tolist() + [-1] * (n - lay.num_chunks) if lay else [-1] * n, d["save_after"], [],
            d["save_slots"], d["save_cols"].view(2 * s, w), d["row_slots"].view(2 * s + 1, 2),
            d["reads"], d["fresh"].view(s, 1, 1),
            d["token_pos"], d["chunk_first"], d["chunk_len"], s * w + t,
            lay.buffer_starts.tolist() if lay else list(range(0, (s + 1) * w, w)), d["token_cols"],
            d["state_cols"].view(s, w), d["step_rows"], d["step_reads"], d["step_slots"].view(s, 2), d["scan_seqs"])

    def fits(self, seqs: list[ScheduledSeq], t: int, num_tokens: int) -> bool:
        """Whether the step's layout (num_tokens in all) fits graph t's plan: chunks within chunks(t) and
        chunked(t), at most 2 cuts and saves per sequence, no state due before a sequence's first token (the scan
        writes those after it, from host lists). Sequences the recurrent step takes (takes_step) need no chunk."""
        if len(seqs) >= self.slots[t]:
            return False
        size, pad = self.chunk_size, t - num_tokens
        chunked = int(pad > 0 and not takes_step(pad, ()))
        chunks = chunked * -(-pad // size)
        for s in seqs:
            if s.state is None or len(s.state.snapshots) > 1:
                return False
            cut, n = (s.state.snapshots[0][0] if s.state.snapshots else 0), len(s.token_ids)
            if s.state.snapshots and cut == 0:
                return False
            if not takes_step(n, (offset for offset, _ in s.state.snapshots)):
                chunked += 1
                chunks += -(-cut // size) + -(-(n - cut) // size)
        return chunks <= self.chunks[t] and chunked <= self.chunked[t]

    def stage(self, seqs: list[ScheduledSeq], t: int,
              query_starts: list[int]) -> tuple[ChunkPlan, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Writes the step's layout (fits) into the host buffers; returns graph t's plan (with the step's host
        lists) and the (device, host) pairs to copy. query_starts: the step's sequences' first rows, then the
        padding sequence's, then t (len(seqs) + 2 entries; CudaGraphRunner._stage_mixed's)."""
        s_max, n_max, w = self.slots[t], self.chunks[t], self.width
        empty = s_max - len(seqs) - 1
        assert len(query_starts) == len(seqs) + 2 and query_starts[-1] == t, "query starts of the padded step"
        fresh = [-1] * (empty + 1)
        lay = ChunkLayout.build(query_starts + [t] * empty, [s.state.read_slot for s in seqs] + fresh,
                                [s.state.write_slot for s in seqs] + [self.scratch_slot] * (empty + 1),
                                [s.state.snapshots for s in seqs] + [()] * (empty + 1), w, self.chunk_size)
        assert lay.num_chunks <= n_max and len(lay.scan_seqs) <= self.chunked[t] and not lay.initial_saves, \
            "staged a step that does not fit (fits)"
        h = {k: v.numpy() for k, v in self.host.items()}

        def put(key: str, values: np.ndarray, size: int, pad: int) -> None:  # the layout's own, then padding
            h[key][: len(values)], h[key][len(values): size] = values, pad

        h["token_pos"][:t], h["token_cols"][:t] = lay.token_pos, lay.token_cols
        h["reads"][:s_max], h["fresh"][:s_max] = np.maximum(lay.reads, 0), lay.reads < 0
        h["seq_chunks"][: s_max + 1] = lay.seq_chunks
        h["state_cols"][: s_max * w] = lay.state_cols.ravel()
        for key, pad in (("save_after", -1), ("chunk_first", 0), ("chunk_len", 0)):
            put(key, getattr(lay, key), n_max, pad)
        put("save_slots", lay.save_slots, 2 * s_max, -1)
        put("save_cols", lay.save_cols.ravel(), 2 * s_max * w, 0)
        put("step_rows", lay.step_rows, s_max, -1)
        put("step_reads", lay.step_reads, s_max, 0)
        put("scan_seqs", lay.scan_seqs, self.chunked[t], -1)
        # rows and steps past the step's own (and a second slot where one has one) take no state
        for key, slots, count in (("row_slots", lay.row_slots, 2 * s_max + 1), ("step_slots", lay.step_slots, s_max)):
            dst = h[key][: 2 * count].reshape(-1, 2)
            dst[:] = -1
            dst[: len(slots), : slots.shape[1]] = slots
        return self._plan(t, lay), [(self.dev[k][:size], self.host[k][:size]) for k, size in self._sizes(t).items()]


class CudaGraphRunner:
    def __init__(self, model: nn.Module, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device, num_kv_groups: int = 1, state_scratch_slot: int | None = None,
                 use_graphs: bool = True, fill_placeholders: FillPlaceholders | None = None,
                 token_sizes: Sequence[int] = (), state_width: int | None = None,
                 logits: tuple[int, torch.dtype] | None = None) -> None:
        """state_scratch_slot: the slot padding rows write their recurrent state into (models with state slots).
        use_graphs=False keeps the static buffers and staging but no pinned memory, events or capture: run() calls
        the forward on the static buffers (the CPU test of what a graph would read). fill_placeholders: called on
        the static input ids once the staged ones are copied in, before the replay (the model runner's).
        token_sizes: the token counts of mixed-step graphs. state_width: the conv window (K - 1) of the recurrent
        layers' chunk plans (models with state slots and mixed graphs). logits: (vocabulary size, dtype) of the
        buffer every step's logits are written into (default: each forward's own)."""
        self.model = model
        self.fill_placeholders = fill_placeholders
        self.block_size = block_size
        self.num_kv_groups = num_kv_groups
        self.state_scratch_slot = state_scratch_slot
        self.use_graphs = use_graphs
        self.batch_sizes = [b for b in GRAPH_BATCH_SIZES if b < max_num_seqs] + [max_num_seqs]
        b, nb, groups = self.batch_sizes[-1], max_blocks_per_seq, num_kv_groups
        self.max_blocks = nb
        self.token_sizes = sorted(token_sizes)
        self.has_state = state_scratch_slot is not None
        # a mixed graph's sequence slots, the padding sequence's not counted
        cap = STATE_MIXED_SEQS if self.has_state else max_num_seqs
        self.mixed_seqs = {t: min(t, max_num_seqs, cap) for t in self.token_sizes}
        self.chunk_plans: StaticChunkPlans | None = None
        if self.has_state and self.token_sizes:
            assert state_width is not None, "mixed graphs of a model with state slots need its conv width"
            self.chunk_plans = StaticChunkPlans({t: s + 1 for t, s in self.mixed_seqs.items()}, state_width,
                                                state_scratch_slot, device, use_graphs)
        tokens = max([b, *self.token_sizes])
        rows = max([b, *(s + 1 for s in self.mixed_seqs.values())])
        # static device inputs, read by every captured graph; one slot mapping and block table per KV group
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(groups, tokens, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(groups, rows, nb, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=device)  # decode: one query each
        self.mixed_query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.sample_rows = torch.zeros(max(self.mixed_seqs.values(), default=1), dtype=torch.int64, device=device)
        self._table_stage = torch.zeros(groups, rows * nb, dtype=torch.int32, device=device)
        # recurrent-state slots: until the first step, every row reads zeros and writes the scratch slot
        self.read_slots = torch.full((b,), -1, dtype=torch.int64, device=device)
        self.write_slots = torch.full((b,), state_scratch_slot or 0, dtype=torch.int64, device=device)
        # host staging (pinned for graphs), reused every step once the previous step's copies have left it
        self._h_i64 = _host((2 + groups + 2, tokens), torch.int64, use_graphs)  # ids, positions, slots/group, states
        self._h_seq_lens = _host((rows,), torch.int32, use_graphs)
        self._h_table = _host((groups, rows * nb), torch.int32, use_graphs)  # a region per group: stale ids stay valid
        self._h_query_start = _host((rows + 1,), torch.int32, use_graphs)
        self._h_sample_rows = _host((self.sample_rows.shape[0],), torch.int64, use_graphs)
        # the last step's copies out of the pinned staging buffers
        self._staged = torch.cuda.Event() if use_graphs else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # every step's logits, written by the LM head's GEMM outside the graphs' memory pool: a graph's own
        # [rows, vocab] output would stay allocated per graph (qwen3-8b: 78 MB at 256 rows, 265 MB over the
        # decode sizes); in one buffer each replay overwrites the last one's
        self.logits = None if logits is None else torch.empty(max(b, self.sample_rows.shape[0]), logits[0],
                                                              dtype=logits[1], device=device)

    def _meta(self, b: int, max_seq_len: int = 0) -> AttentionMetadata:
        # decode-only layers read device tensors only; the host lists describe the padded batch's shape
        state = StateMetadata([], [], [], self.read_slots[:b], self.write_slots[:b]) if self.has_state else None
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[0, :b], query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b], block_tables=self.block_tables[0, :b], max_query_len=1,
            max_seq_len=max_seq_len, query_start_loc_cpu=list(range(b + 1)), seq_lens_cpu=[1] * b, state=state,
        )
        if self.num_kv_groups > 1:
            meta.groups = [meta] + [replace(meta, slot_mapping=self.slot_mapping[g, :b],
                                            block_tables=self.block_tables[g, :b], groups=None, derived={})
                                    for g in range(1, self.num_kv_groups)]
        return meta

    def _mixed_meta(self, t: int, host: tuple[list[int], list[int]] | None = None,
                    plan: ChunkPlan | None = None) -> AttentionMetadata:
        """A mixed graph's metadata over its sequence slots and the padding sequence. host: the step's query starts
        and sequence lengths (use_graphs=False: the reference ops loop over them), plan: its chunk plan with the
        step's host lists (models with state slots); captured, the lists only give the grid's shape: every slot
        with t queries, so nothing is split off or sent to flash attention."""
        s = self.mixed_seqs[t] + 1
        state = None
        if self.chunk_plans is not None:  # the recurrent layers read the plan's slots, not the decode ones
            state = StateMetadata([], [], [], self.read_slots[:0], self.write_slots[:0],
                                  plan or self.chunk_plans.plans[t])
        qsl_cpu, lens_cpu = host if host is not None else ([0] + [t] * s, [t] * s)
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[0, :t], query_start_loc=self.mixed_query_start_loc[: s + 1],
            seq_lens=self.seq_lens[:s], block_tables=self.block_tables[0, :s],
            max_query_len=t if host is None else max(b - a for a, b in itertools.pairwise(qsl_cpu)),
            max_seq_len=max(lens_cpu), query_start_loc_cpu=qsl_cpu, seq_lens_cpu=lens_cpu, state=state,
        )
        if self.num_kv_groups > 1:
            meta.groups = [meta] + [replace(meta, slot_mapping=self.slot_mapping[g, :t],
                                            block_tables=self.block_tables[g, :s], groups=None, derived={})
                                    for g in range(1, self.num_kv_groups)]
        return meta

    def _forward(self, b: int, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.model(self.input_ids[:b], self.positions[:b], meta)
        # model dtype: greedy argmax needs no float32 copy
        return self.model.compute_logits(hidden, None if self.logits is None else self.logits[:b])

    def _forward_mixed(self, t: int, meta: AttentionMetadata) -> torch.Tensor:
        s = self.mixed_seqs[t]  # the last layer's MLP runs on the sampled rows alone (out_rows in layers/decoder.py)
        hidden = self.model(self.input_ids[:t], self.positions[:t], meta, self.sample_rows[:s])
        return self.model.compute_logits(hidden, None if self.logits is None else self.logits[:s])

    @torch.inference_mode()
    def capture(self) -> None:
        assert self.use_graphs, "a runner built with use_graphs=False calls the forward eagerly"
        assert self.logits is not None, "captured graphs write their logits into a shared buffer (logits=...)"
        pool = None
        steps = [(b, False) for b in self.batch_sizes] + [(t, True) for t in self.token_sizes]
        for size, mixed in sorted(steps, reverse=True):  # most tokens first: smaller graphs reuse its memory pool
            meta = self._mixed_meta(size) if mixed else self._meta(size)
            forward = self._forward_mixed if mixed else self._forward
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up: compiles kernels, picks cuBLAS algorithms, builds tables
                logits = forward(size, meta)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            del logits
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                forward(size, meta)
            pool = graph.pool()
            (self.mixed_graphs if mixed else self.graphs)[size] = graph
        torch.cuda.synchronize()

    def padded_size(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.batch_sizes, num_seqs)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def can_run(self, seqs: list[ScheduledSeq]) -> bool:
        """Decode-only steps that fit a captured size; prompt logprobs need hidden states, so they run eagerly."""
        if self.padded_size(len(seqs)) is None:
            return False
        for s in seqs:
            if len(s.token_ids) != 1 or not s.do_sample or len(s.block_ids) > self.max_blocks:
                return False
            if s.wants_prompt_logprobs:
                return False
            if self.num_kv_groups > 1 and any(len(ids) > self.max_blocks for ids in s.group_block_ids):
                return False
            if self.has_state and s.state is None:
                return False
        return True

    def token_size(self, num_tokens: int) -> int | None:
        i = bisect.bisect_left(self.token_sizes, num_tokens)
        return self.token_sizes[i] if i < len(self.token_sizes) else None

    def mixed_size(self, seqs: list[ScheduledSeq], num_tokens: int) -> int | None:
        """The token count of the graph a mixed step of num_tokens runs through (run_mixed), or None where it runs
        eagerly: steps of up to the largest captured token count (prompt chunks, decodes among them); prompt
        logprobs need every row's hidden state, so those run eagerly."""
        t = self.token_size(num_tokens)
        if t is None or len(seqs) > self.mixed_seqs[t]:
            return None
        for s in seqs:
            if len(s.block_ids) > self.max_blocks:
                return None
            if s.wants_prompt_logprobs:
                return None
            if self.num_kv_groups > 1 and any(len(ids) > self.max_blocks for ids in s.group_block_ids):
                return None
        return t if self.chunk_plans is None or self.chunk_plans.fits(seqs, t, num_tokens) else None

    def _stage(self, seqs: list[ScheduledSeq], b: int) -> int:
        """Writes the step's inputs into the host staging buffers; returns the block tables' width."""
        n, bs, groups = len(seqs), self.block_size, self.num_kv_groups
        h = self._h_i64.numpy()
        positions = [s.start_pos for s in seqs]
        h[0, :n] = [s.token_ids[0] for s in seqs]
        h[1, :n] = positions
        tables = [[s.block_ids for s in seqs]] + [[s.group_block_ids[g - 1] for s in seqs] for g in range(1, groups)]
        for g, ids in enumerate(tables):
            h[2 + g, :n] = [blocks[p // bs] * bs + p % bs for blocks, p in zip(ids, positions)]
        h[:, n:b] = 0  # padding rows: token 0 at position 0, KV into the scratch slot 0 of each group
        if self.has_state:
            h[2 + groups, :n] = [s.state.read_slot for s in seqs]
            h[3 + groups, :n] = [s.state.write_slot for s in seqs]
            h[2 + groups, n:b] = -1  # padding rows read zeros and write the scratch state slot
            h[3 + groups, n:b] = self.state_scratch_slot
        seq_lens = self._h_seq_lens.numpy()
        seq_lens[:n] = positions
        seq_lens[:n] += 1
        seq_lens[n:b] = 1
        cols = max(len(blocks) for ids in tables for blocks in ids)
        for g, ids in enumerate(tables):
            table = self._h_table[g].numpy()[: b * cols].reshape(b, cols)
            for i, blocks in enumerate(ids):
                table[i, : len(blocks)] = blocks
            table[n:b, 0] = 0
        return cols

    def _stage_mixed(self, seqs: list[ScheduledSeq], t: int, num_tokens: int) -> tuple[int, int, list[int], list[int]]:
        """Writes a mixed step's inputs into the host staging buffers: its tokens, then the padding sequence's rows
        up to t (token 0 at position 0, KV into scratch slot 0), the block tables (the padding sequence's row:
        the scratch block), lengths, query starts (empty slots after the padding sequence) and the rows to sample.
        Returns the block tables' width, how many rows are sampled, and the host query starts and lengths, the
        padding sequence's included (n + 2 and n + 1 entries)."""
        n, bs, groups = len(seqs), self.block_size, self.num_kv_groups
        lens = [len(s.token_ids) for s in seqs]
        start_pos = [s.start_pos for s in seqs]
        token_seq, positions = step_positions(start_pos, lens)
        h = self._h_i64.numpy()
        h[0, :num_tokens] = np.fromiter(itertools.chain.from_iterable(s.token_ids for s in seqs), np.int64,
                                        count=num_tokens)
        h[1, :num_tokens] = positions
        h[: 2 + groups, num_tokens:t] = 0
        tables = [[s.block_ids for s in seqs]] + [[s.group_block_ids[g - 1] for s in seqs] for g in range(1, groups)]
        pad = t - num_tokens
        cols = max(max(len(blocks) for ids in tables for blocks in ids), -(-pad // bs))
        for g, ids in enumerate(tables):
            table = padded_tables(ids, cols)
            h[2 + g, :num_tokens] = token_slots(table, token_seq, positions, bs)
            staged = self._h_table[g].numpy()[: (n + 1) * cols].reshape(n + 1, cols)
            staged[:n] = table
            staged[n] = 0
        seq_lens = [p + k for p, k in zip(start_pos, lens)] + [pad]
        rows = self.mixed_seqs[t] + 1
        lens_h = self._h_seq_lens.numpy()
        lens_h[: n + 1] = seq_lens
        lens_h[n + 1: rows] = 0
        qsl = [0, *itertools.accumulate(lens), t]
        qsl_h = self._h_query_start.numpy()
        qsl_h[: n + 2] = qsl
        qsl_h[n + 2: rows + 1] = t
        sample = [end - 1 for s, end in zip(seqs, qsl[1:]) if s.do_sample]
        sample_h = self._h_sample_rows.numpy()
        sample_h[: len(sample)] = sample
        sample_h[len(sample): self.mixed_seqs[t]] = 0
        return cols, len(sample), qsl, seq_lens

    def _copy_staged(self, seqs: list[ScheduledSeq], ends, tokens: int, seq_rows: int, table_rows: int, cols: int,
                     extra: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copies a staged step into the static buffers: token ids (then the placeholders among them: ends[i] is
        one past sequence i's last row), positions and each group's slot mapping over `tokens` rows, sequence
        lengths over seq_rows, the (dst, src) pairs of extra, and each group's block table [table_rows, cols]."""
        is_async = self.use_graphs
        self.input_ids[:tokens].copy_(self._h_i64[0, :tokens], non_blocking=is_async)
        if self.fill_placeholders is not None:  # after the copy above, in stream order
            self.fill_placeholders(self.input_ids, seqs, ends)
        self.positions[:tokens].copy_(self._h_i64[1, :tokens], non_blocking=is_async)
        self.seq_lens[:seq_rows].copy_(self._h_seq_lens[:seq_rows], non_blocking=is_async)
        for dst, src in extra:
            dst.copy_(src, non_blocking=is_async)
        size = table_rows * cols
        for g in range(self.num_kv_groups):  # row by row: host-to-device copies of contiguous pinned memory only
            self.slot_mapping[g, :tokens].copy_(self._h_i64[2 + g, :tokens], non_blocking=is_async)
            self._table_stage[g, :size].copy_(self._h_table[g, :size], non_blocking=is_async)
        if self._staged is not None:
            self._staged.record()
        for g in range(self.num_kv_groups):
            self.block_tables[g, :table_rows, :cols].copy_(self._table_stage[g, :size].view(table_rows, cols))

    def run_mixed(self, seqs: list[ScheduledSeq], t: int, num_tokens: int) -> torch.Tensor:
        """A mixed step of num_tokens through graph t (mixed_size): copies the inputs into the static buffers and
        replays; returns the logits of its sampled sequences, in order, in the model dtype (a view of the graph's
        output, valid until the next replay)."""
        n = len(seqs)
        if self._staged is not None:
            self._staged.synchronize()
        cols, num_sample, qsl, seq_lens = self._stage_mixed(seqs, t, num_tokens)
        plan, plan_copies = self.chunk_plans.stage(seqs, t, qsl) if self.chunk_plans is not None else (None, [])
        if num_tokens == t:  # the padding sequence is empty: the host lists leave it out
            qsl, seq_lens = qsl[:-1], seq_lens[:-1]
        s = self.mixed_seqs[t] + 1
        self._copy_staged(seqs, qsl[1: n + 1], t, s, n + 1, cols, [
            (self.mixed_query_start_loc[: s + 1], self._h_query_start[: s + 1]),
            (self.sample_rows[: s - 1], self._h_sample_rows[: s - 1]), *plan_copies])
        if not self.use_graphs:
            return self._forward_mixed(t, self._mixed_meta(t, (qsl, seq_lens), plan))[:num_sample]
        self.mixed_graphs[t].replay()
        return self.logits[:num_sample]

    def run(self, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Copies the step's inputs into the static buffers and replays; returns logits [n, V] in the model dtype
        (a view of the graph's output, valid until the next replay)."""
        n, groups = len(seqs), self.num_kv_groups
        b = self.padded_size(n)
        if self._staged is not None:
            self._staged.synchronize()  # the last step's input copies, queued before its replay: done or nearly
        cols = self._stage(seqs, b)
        state = [(self.read_slots[:b], self._h_i64[2 + groups, :b]),
                 (self.write_slots[:b], self._h_i64[3 + groups, :b])] if self.has_state else []
        self._copy_staged(seqs, range(1, n + 1), b, b, b, cols, state)
        if not self.use_graphs:
            max_seq_len = int(self._h_seq_lens[:n].max())
            return self._forward(b, self._meta(b, max_seq_len))[:n]
        self.graphs[b].replay()
        return self.logits[:n]
