"""CUDA graphs of decode steps: the model forward and the logits of B sequences with one query token each,
captured once per padded batch size, replayed with new inputs copied into static buffers.

A decode step launches ~10 kernels per layer; eagerly the host cannot issue them as fast as the GPU runs them,
replayed from a graph it issues them all at once. Padding rows (batch n padded to the captured size b) write
their KV into slot 0 of block 0, the block pool's reserved scratch block, and their logits are dropped.
The attention kernels read sequence lengths and block tables on the device, so one graph serves any lengths.
"""
from __future__ import annotations

import bisect

import numpy as np
import torch
from torch import nn

from ember.engine.scheduler import ScheduledSeq
from ember.worker.attn_metadata import AttentionMetadata

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def _pinned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=True)


class CudaGraphRunner:
    def __init__(self, model: nn.Module, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.block_size = block_size
        self.batch_sizes = [b for b in GRAPH_BATCH_SIZES if b < max_num_seqs] + [max_num_seqs]
        b, nb = self.batch_sizes[-1], max_blocks_per_seq
        self.max_blocks = nb
        # static device inputs, read by every captured graph
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=device)
        self.positions = torch.zeros(b, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(b, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(b, nb, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=device)
        self._table_stage = torch.zeros(b * nb, dtype=torch.int32, device=device)
        # pinned host staging, reused every step once the previous step's copies have left it
        self._h_i64 = _pinned((3, b), torch.int64)  # input ids, positions, slots
        self._h_seq_lens = _pinned((b,), torch.int32)
        self._h_table = _pinned((b * nb,), torch.int32)
        self._staged = torch.cuda.Event()  # the last step's copies out of the pinned staging buffers
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:b], query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b], block_tables=self.block_tables[:b], max_query_len=1, max_seq_len=0,
            query_start_loc_cpu=list(range(b + 1)), seq_lens_cpu=[1] * b,
        )

    def _forward(self, b: int, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.model(self.input_ids[:b], self.positions[:b], meta)
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def capture(self) -> None:
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
        return True

    def run(self, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Copies the step's inputs into the static buffers and replays; returns logits [n, V] float32 (a view
        of the graph's output, valid until the next replay)."""
        n, bs = len(seqs), self.block_size
        b = self.padded_size(n)
        self._staged.synchronize()  # at once in the engine, which syncs on every step's sampled tokens
        h = self._h_i64.numpy()
        positions = [s.start_pos for s in seqs]
        h[0, :n] = [s.token_ids[0] for s in seqs]
        h[1, :n] = positions
        h[2, :n] = [s.block_ids[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        h[:, n:b] = 0  # padding rows: token 0 at position 0, KV into the scratch slot 0
        seq_lens = self._h_seq_lens.numpy()
        seq_lens[:n] = positions
        seq_lens[:n] += 1
        seq_lens[n:b] = 1
        cols = max(len(s.block_ids) for s in seqs)
        table = self._h_table.numpy()[: b * cols].reshape(b, cols)
        for i, s in enumerate(seqs):
            table[i, : len(s.block_ids)] = s.block_ids
        table[n:b, 0] = 0
        self.input_ids[:b].copy_(self._h_i64[0, :b], non_blocking=True)
        self.positions[:b].copy_(self._h_i64[1, :b], non_blocking=True)
        self.slot_mapping[:b].copy_(self._h_i64[2, :b], non_blocking=True)
        self.seq_lens[:b].copy_(self._h_seq_lens[:b], non_blocking=True)
        stage = self._table_stage[: b * cols]
        stage.copy_(self._h_table[: b * cols], non_blocking=True)
        self._staged.record()
        self.block_tables[:b, :cols].copy_(stage.view(b, cols))
        self.graphs[b].replay()
        return self.logits[b][:n]
