"""Attention metadata: the explicit description of one step's batch that every attention layer reads, and the
host-side builders of its per-token arrays (the model runner's eager steps and the graph runner's staging)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from ember.worker.state_cache import StateMetadata


@dataclass(slots=True)
class AttentionMetadata:
    """Tokens of all scheduled sequences are flattened into one [T] batch, sequence after sequence.

    Sequence i owns query tokens query_start_loc[i]:query_start_loc[i+1]; after this step it holds
    seq_lens[i] tokens of KV, the last (query_len) of them written by this step at slot_mapping.
    """

    slot_mapping: torch.Tensor  # [T] int64, flat index block_id * block_size + offset
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    # host copies for the reference path (no device syncs needed to loop over sequences)
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    state: StateMetadata | None = None  # recurrent-state slots, for hybrid models' linear-attention layers
    # one metadata per KV group (kv/spec.kv_groups) when there are several: same sequences, the group's
    # slot_mapping and block_tables; groups[0] is this object
    groups: list[AttentionMetadata] | None = None
    # values derived from this metadata once per step and shared by every layer (e.g. the decode mask)
    derived: dict = field(default_factory=dict)
    # a captured mixed step (worker/cuda_graph.py): the host lists give only the shape of its sequence slots; the
    # kernels find each program's work from the device tensors, and nothing is routed by the host lists
    captured: bool = False
    # eager steps: the indices of the sequences the step samples from, in the order of their rows in out_rows
    sample_seq_idx: list[int] | None = None

    def for_group(self, group: int) -> AttentionMetadata:
        return self if group == 0 else self.groups[group]

    def decode_view(self, rows: torch.Tensor) -> AttentionMetadata:
        """The last token of each of sample_seq_idx's sequences (rows: their rows in this step) as the one query of
        a decode step over the same KV: for layers that write no KV (Gemma 4's KV-shared layers), of which only the
        sampled rows' outputs are wanted."""
        seqs = self.sample_seq_idx
        assert seqs is not None and len(seqs) == len(rows), "rows must be the last rows of sample_seq_idx"
        lens = [self.seq_lens_cpu[i] for i in seqs]
        idx = torch.tensor(seqs, dtype=torch.int64).to(self.seq_lens.device, non_blocking=True)
        qsl = torch.arange(len(seqs) + 1, dtype=torch.int32, device=self.seq_lens.device)

        def view(m: AttentionMetadata) -> AttentionMetadata:
            return AttentionMetadata(m.slot_mapping[rows], qsl, m.seq_lens[idx], m.block_tables[idx], 1, max(lens),
                                     list(range(len(seqs) + 1)), lens)

        out = view(self)
        if self.groups is not None:
            out.groups = [out] + [view(g) for g in self.groups[1:]]
        return out

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def step_positions(start_pos: list[int], lens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(sequence index, position) of each of a step's tokens, int64: sequence i's lens[i] tokens from position
    start_pos[i]. Vectorized with token_slots: a 32k-token prefill step's per-sequence ranges and per-block slot lists
    were ~4 ms of host time before its launch."""
    lens_np = np.array(lens, dtype=np.int64)
    offset = np.array(start_pos, dtype=np.int64) - (np.cumsum(lens_np) - lens_np)  # position minus row, per sequence
    pos = np.arange(int(lens_np.sum()), dtype=np.int64) + np.repeat(offset, lens_np)
    return np.repeat(np.arange(len(lens)), lens_np), pos


def token_slots(tables: np.ndarray, seq: np.ndarray, pos: np.ndarray, block_size: int) -> np.ndarray:
    """Pool slots of tokens (seq, pos), their blocks looked up in row seq of tables [S, W]: int64."""
    return tables[seq, pos // block_size].astype(np.int64) * block_size + pos % block_size


def padded_tables(block_ids: list[list[int]], width: int) -> np.ndarray:
    """Each sequence's first `width` block ids, zero-padded: [S, width] int32."""
    rows = (ids[:width] + [0] * (width - len(ids[:width])) for ids in block_ids)
    return np.fromiter(itertools.chain.from_iterable(rows), np.int32, count=len(block_ids) * width).reshape(-1, width)
