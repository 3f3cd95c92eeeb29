"""CUDA graphs of decode steps: the model forward and the logits of B sequences with one query token each,
captured once per padded batch size, replayed with new inputs copied into static buffers.

A decode step launches ~10 kernels per layer; eagerly the host cannot issue them as fast as the GPU runs them,
replayed from a graph it issues them all at once. Padding rows (batch n padded to the captured size b) write
their KV into slot 0 of block 0 of every KV group's pool (the reserved scratch block) and their recurrent state
into the state cache's scratch slot, reading zeros; their logits are dropped. The attention kernels read sequence
lengths and block tables on the device, the recurrent layers their state slots, so one graph serves any step.
Hybrid models get static buffers for each extra KV group's slot mapping and block table and for the state slots.
"""
from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Callable, Sequence

import torch
from torch import nn

from ember.engine.scheduler import ScheduledSeq
from ember.worker.attn_metadata import AttentionMetadata
from ember.worker.state_cache import StateMetadata

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)

# (input_ids, seqs, ends): writes tokens still on the device (async scheduling's placeholders) into input_ids
FillPlaceholders = Callable[[torch.Tensor, list[ScheduledSeq], Sequence[int]], None]


def _host(shape: tuple[int, ...], dtype: torch.dtype, is_pinned: bool) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=is_pinned)


class CudaGraphRunner:
    def __init__(self, model: nn.Module, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device, num_kv_groups: int = 1, state_scratch_slot: int | None = None,
                 use_graphs: bool = True, fill_placeholders: FillPlaceholders | None = None) -> None:
        """state_scratch_slot: the slot padding rows write their recurrent state into (models with state slots).
        use_graphs=False keeps the static buffers and staging but no pinned memory, events or capture: run() calls
        the forward on the static buffers (the CPU test of what a graph would read). fill_placeholders: called on
        the static input ids once the staged ones are copied in, before the replay (the model runner's)."""
        self.model = model
        self.fill_placeholders = fill_placeholders
        self.block_size = block_size
        self.num_kv_groups = num_kv_groups
        self.state_scratch_slot = state_scratch_slot
        self.use_graphs = use_graphs
        self.batch_sizes = [b for b in GRAPH_BATCH_SIZES if b < max_num_seqs] + [max_num_seqs]
        b, nb, groups = self.batch_sizes[-1], max_blocks_per_seq, num_kv_groups
        self.max_blocks = nb
        # static device inputs, read by every captured graph; one slot mapping and block table per KV group
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=device)
        self.positions = torch.zeros(b, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(groups, b, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(groups, b, nb, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=device)
        self._table_stage = torch.zeros(groups, b * nb, dtype=torch.int32, device=device)
        # recurrent-state slots: until the first step, every row reads zeros and writes the scratch slot
        self.has_state = state_scratch_slot is not None
        self.read_slots = torch.full((b,), -1, dtype=torch.int64, device=device)
        self.write_slots = torch.full((b,), state_scratch_slot or 0, dtype=torch.int64, device=device)
        # host staging (pinned for graphs), reused every step once the previous step's copies have left it
        self._h_i64 = _host((2 + groups + 2, b), torch.int64, use_graphs)  # ids, positions, slots/group, read, write
        self._h_seq_lens = _host((b,), torch.int32, use_graphs)
        self._h_table = _host((groups, b * nb), torch.int32, use_graphs)  # a region per group: stale ids stay valid
        # the last step's copies out of the pinned staging buffers
        self._staged = torch.cuda.Event() if use_graphs else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

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

    def _forward(self, b: int, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.model(self.input_ids[:b], self.positions[:b], meta)
        return self.model.compute_logits(hidden)  # model dtype: greedy argmax needs no float32 copy

    @torch.inference_mode()
    def capture(self) -> None:
        assert self.use_graphs, "a runner built with use_graphs=False calls the forward eagerly"
        pool = None
        for b in reversed(self.batch_sizes):  # largest first: smaller graphs reuse its memory pool
            meta = self._meta(b)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up: compiles kernels, picks cuBLAS algorithms, builds tables
                self._forward(b, meta)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[b] = self._forward(b, meta)
            pool = graph.pool()
            self.graphs[b] = graph
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
            if s.params.prompt_logprobs is not None and s.start_pos < len(s.prompt_token_ids) - 1:
                return False
            if self.num_kv_groups > 1 and any(len(ids) > self.max_blocks for ids in s.group_block_ids):
                return False
            if self.has_state and s.state is None:
                return False
        return True

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

    def run(self, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Copies the step's inputs into the static buffers and replays; returns logits [n, V] in the model dtype
        (a view of the graph's output, valid until the next replay)."""
        n, groups = len(seqs), self.num_kv_groups
        b = self.padded_size(n)
        if self._staged is not None:
            self._staged.synchronize()  # the last step's input copies, queued before its replay: done or nearly
        cols = self._stage(seqs, b)
        is_async = self.use_graphs
        self.input_ids[:b].copy_(self._h_i64[0, :b], non_blocking=is_async)
        if self.fill_placeholders is not None:  # after the copy above, in stream order
            self.fill_placeholders(self.input_ids, seqs, range(1, n + 1))
        self.positions[:b].copy_(self._h_i64[1, :b], non_blocking=is_async)
        if self.has_state:
            self.read_slots[:b].copy_(self._h_i64[2 + groups, :b], non_blocking=is_async)
            self.write_slots[:b].copy_(self._h_i64[3 + groups, :b], non_blocking=is_async)
        self.seq_lens[:b].copy_(self._h_seq_lens[:b], non_blocking=is_async)
        for g in range(groups):  # row by row: host-to-device copies of contiguous pinned memory only
            self.slot_mapping[g, :b].copy_(self._h_i64[2 + g, :b], non_blocking=is_async)
            self._table_stage[g, : b * cols].copy_(self._h_table[g, : b * cols], non_blocking=is_async)
        if self._staged is not None:
            self._staged.record()
        for g in range(groups):
            self.block_tables[g, :b, :cols].copy_(self._table_stage[g, : b * cols].view(b, cols))
        if not self.use_graphs:
            max_seq_len = int(self._h_seq_lens[:n].max())
            return self._forward(b, self._meta(b, max_seq_len))[:n]
        self.graphs[b].replay()
        return self.logits[b][:n]
