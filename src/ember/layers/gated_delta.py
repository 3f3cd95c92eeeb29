"""Gated DeltaNet token mixer (arXiv:2412.06464) as Qwen3.5 / Qwen3-Next use it: a fused input projection, a
short causal depthwise conv over q/k/v, the gated delta rule with one value head group per key head, and a
gated RMSNorm on the output. Its whole history is a fixed-size state per request (kv/spec.RecurrentStateSpec):
conv window [conv_dim, K-1] and recurrent matrix [Hv, Dk, Dv] (fp32, as transformers keeps it).
Prefill takes the snapshots due inside its chunk; a decode step reads only device slot ids (it is graph-captured)
and the runner copies its snapshots afterwards (StateCache.copy_slots).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember import ops
from ember.kv.spec import RecurrentStateSpec, StateTensor
from ember.layers.linear import Linear, MergedLinear
from ember.ops import gated_delta as gd
from ember.worker.attn_metadata import AttentionMetadata
from ember.worker.state_cache import StateMetadata


@dataclass(frozen=True, slots=True)
class GatedDeltaArgs:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


class GatedRMSNorm(nn.Module):
    """RMSNorm(x) * w * silu(gate), normalised in fp32 and cast back before the weight (Qwen3_5RMSNormGated)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)


class DepthwiseConv(nn.Module):
    """Holds the conv1d weight under its HF name and shape [C, 1, K]; the ops take it as [C, K]."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(self, a: GatedDeltaArgs) -> None:
        super().__init__()
        if a.num_v_heads % a.num_k_heads:
            raise ValueError(f"linear_num_value_heads={a.num_v_heads} must be a multiple of "
                             f"linear_num_key_heads={a.num_k_heads}")
        self.a = a
        # HF's in_proj_qkv / in_proj_z fused into one matmul; b and a (write strength, decay) stay apart, as the
        # decay's exp amplifies the last-bit differences a differently shaped GEMM would bring
        self.in_proj = MergedLinear(a.hidden_size, {"qkv": a.conv_dim, "z": a.value_dim})
        self.in_proj_b = Linear(a.hidden_size, a.num_v_heads)
        self.in_proj_a = Linear(a.hidden_size, a.num_v_heads)
        self.conv1d = DepthwiseConv(a.conv_dim, a.conv_kernel)
        self.dt_bias = nn.Parameter(torch.ones(a.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(a.num_v_heads))
        self.norm = GatedRMSNorm(a.head_v_dim, a.eps)
        self.out_proj = Linear(a.value_dim, a.hidden_size)
        self.state: dict[str, torch.Tensor] | None = None  # {"conv", "ssm"}: [num_slots, ...], bound by the runner

    def cache_spec(self) -> RecurrentStateSpec:
        a = self.a
        return RecurrentStateSpec((StateTensor("conv", (a.conv_dim, a.conv_kernel - 1)),
                                   StateTensor("ssm", (a.num_v_heads, a.head_k_dim, a.head_v_dim), torch.float32)))

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        a = self.a
        num_tokens = x.shape[0]
        mixed, z = self.in_proj(x).split([a.conv_dim, a.value_dim], dim=-1)
        # g: fp32 log decay (<= 0), beta: write strength, both [num_tokens, Hv]
        g, beta = ops.gdn_gating(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)
        assert self.state is not None and meta.state is not None, "state slots are bound and scheduled by the runner"
        if meta.is_decode_only:
            core = self._decode(mixed, beta, g, meta.state)
        else:
            core = self._prefill(mixed, beta, g, meta)
        # [num_tokens, Hv, Dv]; z stays a view of the in_proj output (a reshape to rows would copy it)
        core = self.norm(core.reshape(num_tokens, a.num_v_heads, a.head_v_dim),
                         z.unflatten(-1, (a.num_v_heads, a.head_v_dim)))
        return self.out_proj(core.reshape(num_tokens, a.value_dim))

    def _split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.a
        return gd.split_heads(mixed, a.num_k_heads, a.head_k_dim, a.num_v_heads, a.head_v_dim)

    def _decode(self, mixed, beta, g, st: StateMetadata) -> torch.Tensor:
        # one token per sequence, device slot ids only (graph-capturable); the runner copies decode snapshots
        return ops.gated_delta_decode(mixed, self.conv1d.weight[:, 0], g, beta, self.state["conv"], self.state["ssm"],
                                      st.read_slots, st.write_slots)

    def _prefill(self, mixed, beta, g, meta: AttentionMetadata) -> torch.Tensor:
        # every sequence of the step at once; the chunk plan is built once per step and shared by the layers
        plan = meta.state.chunk_plan(meta.query_start_loc_cpu, self.a.conv_kernel - 1, mixed.device)
        return gd.gated_delta_prefill(mixed, self.conv1d.weight[:, 0], g, beta, self.state["conv"], self.state["ssm"],
                                      plan, self.a.num_k_heads, **ops.GATED_DELTA_CHUNKED)
