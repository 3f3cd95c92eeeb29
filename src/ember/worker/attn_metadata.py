"""Attention metadata: the explicit description of one step's batch that every attention layer reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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

    def for_group(self, group: int) -> AttentionMetadata:
        return self if group == 0 else self.groups[group]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
