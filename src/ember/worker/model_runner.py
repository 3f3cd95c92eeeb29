"""The model runner owns every tensor: weights, the KV pool, step inputs. It turns a SchedulerOutput into
sampled tokens and logprobs, and makes no scheduling decisions.

`launch` enqueues a step's device work and returns a `StepHandle` without waiting for the device; its `result()`
is the one host sync. The runner keeps the last launched step's sampled ids on the device, so a decode that feeds a
placeholder token (async scheduling: that sample is not on the host yet) takes it from there."""
from __future__ import annotations

import array
import gc
import itertools
import os
from dataclasses import dataclass, field, fields, is_dataclass, replace

import numpy as np
import torch

from ember import ops
from ember.config import CacheConfig, ModelConfig
from ember.kv.state_pool import StateStep
from ember.kv.spec import (LayerCacheSpec, RecurrentStateSpec, SharedKVSpec, kv_groups, layer_kv_groups,
                           sliding_group_blocks, state_bytes_per_slot, with_recurrent_dtype)
from ember.engine.scheduler import ScheduledSeq, SchedulerOutput
from ember.request import PLACEHOLDER_TOKEN_ID
from ember.sample.metadata import SamplingMetadata, SamplingRow
from ember.sample.sampler import LogprobsTensors, Sampler, compute_logprobs
from ember.parallel import get_tp
from ember.weights.loader import load_model
from ember.worker.attn_metadata import AttentionMetadata, padded_tables, step_positions, token_slots
from ember.worker.state_cache import StateCache, StateMetadata
from ember.worker.cuda_graph import GRAPH_BATCH_SIZES, GRAPH_TOKEN_SIZES, CudaGraphRunner

CPU_DEFAULT_KV_GB = 1.0
# a default max_num_seqs is halved, down to FIT_MIN_SEQS, while the caches every sequence holds whatever its length
# (recurrent state slots, sliding-window blocks) would take more than this share of the cache budget
FIT_FIXED_SHARE = 0.25
FIT_MIN_SEQS = 16
# a default token budget is halved, down to FIT_MIN_TOKENS (a server's default on a big GPU, and an offline one on
# smaller GPUs), while the activations of a step that size would take more than this share of the memory the cache
# and they divide (a 32B model on an 80 GiB GPU: 32768 -> 8192)
FIT_RESERVE_SHARE = 0.125
FIT_MIN_TOKENS = 8192
# prompt logprobs: logits rows computed at a time. A chunk may be a whole 16k-token step budget, whose float32
# logits over a 152k vocabulary would take 10 GB at once; 1024 rows take ~0.9 GB (with the model-dtype copy)
PROMPT_LOGPROBS_ROWS = 1024
# one-token sequences in warm_up's mixed step: at least ops.triton.attention.MIXED_DECODE_MIN_SEQS (16), so that the
# mixed-step decode path runs, and its rows at least ops.triton.reduce.MIN_ROWS, so that the argmax kernels do
MIXED_STEP_DECODES = 16


@dataclass(slots=True)
class TokenLogprobs:
    """Logprobs of one position: the chosen token first, then the top-k (ids, logprobs), and its rank."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


@dataclass(slots=True)
class ModelRunnerOutput:
    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # prompt logprobs of this chunk's positions, one entry per prompt token after the first
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


@dataclass(slots=True)
class StepHandle:
    """A launched step. Its sampled ids (and logprobs) are copied to the host behind `ready`; result() waits."""

    sample_seqs: list[ScheduledSeq]
    token_ids: torch.Tensor | None = None  # [S] int64 host (pinned on CUDA), valid once `ready` has fired
    logprobs: LogprobsTensors | None = None  # host copies, same rows
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    ready: torch.cuda.Event | None = None
    _result: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        if self._result is None:
            if self.ready is not None:
                self.ready.synchronize()
            self._result = self._build()
        return self._result

    def _build(self) -> ModelRunnerOutput:
        seqs = self.sample_seqs
        result = ModelRunnerOutput(prompt_logprobs=self.prompt_logprobs)
        if not seqs:
            return result
        token_ids = self.token_ids.tolist()
        result.sampled = dict(zip((s.req_id for s in seqs), token_ids))
        if self.logprobs is not None:
            rows = _rows(self.logprobs, len(seqs))
            for seq, row in zip(seqs, rows):
                if seq.params.logprobs is not None:
                    k = seq.params.logprobs + 1
                    result.logprobs[seq.req_id] = TokenLogprobs(row.token_ids[:k], row.logprobs[:k], row.rank)
        return result


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_idx: torch.Tensor  # [S] rows of the hidden states to sample from
    sample_seqs: list[ScheduledSeq]


def _is_plain_greedy(seq: ScheduledSeq) -> bool:
    """Greedy with nothing for the sampler to change before its argmax (no bias, bans, penalties, logprobs)."""
    p = seq.params
    return (p.is_greedy and p.logprobs is None and not p.logit_bias and p.repetition_penalty == 1.0
            and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and len(seq.output_token_ids) >= p.min_tokens)


def _to_device(obj, device: torch.device):
    """A (nested) dataclass of host tensors on `device`, through pinned memory and non-blocking copies."""
    if isinstance(obj, torch.Tensor):
        return obj if device.type != "cuda" else obj.pin_memory().to(device, non_blocking=True)
    if is_dataclass(obj):
        return replace(obj, **{f.name: _to_device(getattr(obj, f.name), device) for f in fields(obj)})
    return obj


# device memory kept out of the cache budget for activations and the graphs, at least (activation_reserve)
CUDA_ACTIVATION_RESERVE = 2 * 2**30


def activation_reserve(hf: dict, num_tokens: int, dtype_bytes: int) -> int:
    """Device memory to keep out of the cache budget for a step of num_tokens: per token, the widest layer's live
    tensors (residual stream, normed input, fused gate/up output and its activation, qkv rows) with a 1.5x margin
    for the allocator's slack; never less than CUDA_ACTIVATION_RESERVE (graphs, small steps). qwen3-8b: 2 GiB up
    to ~12k tokens, 5.4 GiB at a 32k-token budget."""
    hidden, heads = hf.get("hidden_size", 0), hf.get("num_attention_heads", 0)
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or (hidden // heads if heads else 0)
    moe = (hf.get("moe_intermediate_size") or 0) * (hf.get("num_experts_per_tok") or 1)
    inter = max(hf.get("intermediate_size") or 0, moe)
    per_token = (4 * hidden + 3 * inter + (heads + 2 * kv_heads) * head_dim) * dtype_bytes
    return max(CUDA_ACTIVATION_RESERVE, int(1.5 * per_token * num_tokens))


def _device_tensor(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list or numpy array on `device`; on CUDA through pinned memory and a non-blocking copy (no host sync).
    A flat list of ints goes through array.array, ~4x faster than torch.tensor's per-element conversion."""
    if isinstance(values, np.ndarray):
        host = torch.from_numpy(values).to(dtype)
    elif (code := _ARRAY_CODES.get(dtype)) is not None and values and not isinstance(values[0], (list, tuple)):
        host = torch.frombuffer(array.array(code, values), dtype=dtype)
    else:
        host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


_ARRAY_CODES = {torch.int64: "q", torch.int32: "i"}


def _check_kv_dtype(kv_dtype: torch.dtype, device: torch.device) -> None:
    """An fp8 pool on a GPU whose Triton kernels cannot convert fp8 (compute capability below 8.9: Ada, Hopper)."""
    if kv_dtype.itemsize == 1 and device.type == "cuda" and ops.triton_enabled():
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise ValueError(f"kv_cache_dtype fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); "
                             f"{torch.cuda.get_device_name(device)} is {major}.{minor}: use kv_cache_dtype auto")


def _rows(lp: LogprobsTensors, n: int) -> list[TokenLogprobs]:
    ids, vals, ranks = lp.token_ids.tolist(), lp.logprobs.tolist(), lp.ranks.tolist()
    return [TokenLogprobs(ids[i], vals[i], ranks[i]) for i in range(n)]


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """A device tensor copied into pinned host memory without waiting (the caller records an event after)."""
    return x.to("cpu", non_blocking=True)


class ModelRunner:
    supports_async_scheduling = True  # launch() returns before the device ran the step

    def __init__(self, model_cfg: ModelConfig, cache_cfg: CacheConfig, progress: bool = True) -> None:
        self.model_cfg = model_cfg
        self.cache_cfg = cache_cfg
        self.device = model_cfg.device
        self.dtype = model_cfg.dtype
        self.kv_dtype = cache_cfg.kv_dtype(self.dtype)
        _check_kv_dtype(self.kv_dtype, self.device)
        self.block_size = cache_cfg.block_size
        self.model = load_model(model_cfg, progress)
        self.cache_specs: list[LayerCacheSpec] = with_recurrent_dtype(self.model.cache_specs(),
                                                                      cache_cfg.state_dtype(self.dtype))
        self.kv_groups = kv_groups(self.cache_specs)  # full attention, then one group per sliding window
        self.layer_groups = layer_kv_groups(self.cache_specs, self.kv_groups)
        if cache_cfg.num_blocks is None:  # measured once: on a GPU each measurement collects and empties the cache
            budget = self._cache_budget()
            if cache_cfg.fit_max_num_batched_tokens:
                budget = self._fit_max_num_batched_tokens(budget)
            if cache_cfg.fit_max_num_seqs:
                self._fit_max_num_seqs(budget)
            cache_cfg.num_blocks = get_tp().min_int(self._size_pool(budget), self.device)
        self.num_blocks = cache_cfg.num_blocks
        # sliding groups after the first hold at most their windows' worth of blocks (kv/managers.py)
        self.group_num_blocks = [self.num_blocks] + [min(self.num_blocks, self._sliding_blocks(g.window))
                                                     for g in self.kv_groups[1:]]
        self.kv_caches = self._allocate_kv()
        for layer, cache, group in zip(self.model.attention_layers(), self.kv_caches, self.layer_groups):
            layer.kv_cache, layer.kv_group = cache, group or 0
        self.state_cache = self._allocate_state()
        self.sampler = Sampler()
        self.vocab_size = self.model.args.vocab_size
        # the last launched step's sampled ids, still on the device, and whose they are (row order)
        self._last_token_ids: torch.Tensor | None = None
        self._last_req_ids: list[str] = []
        self.graphs: CudaGraphRunner | None = None
        if self.device.type == "cuda" and ops.triton_enabled() and os.environ.get("EMBER_CUDA_GRAPHS", "1") != "0":
            # no graphs for batches the scheduler never forms
            self.graphs = self.make_graph_runner(min(self.cache_cfg.max_num_seqs, GRAPH_BATCH_SIZES[-1]))
            self.graphs.capture()
        if self.device.type == "cuda" and ops.triton_enabled():
            self.warm_up()

    def warm_up(self) -> None:
        """Runs the eager steps that graph capture does not, so that their Triton kernels compile now rather than
        in the first requests' steps (on an H200 a first batch of 256 prompts paid ~0.6 s of compilation, and a
        108 ms garbage collection of the compiler's objects, in the middle of its run):
        - a mixed step: one-token sequences (the decode kernel from ops MIXED_DECODE_MIN_SEQS of them on), a short
          prompt (the prefill kernel's small tiles) and the argmax over their rows;
        - a prompt chunk over 512 tokens (the wide tiles), when the token budget and context length allow one.
        Both run eagerly, as steps too large for the mixed-step graphs do.
        Every token writes its KV into the reserved scratch block 0 and its recurrent state into the scratch slot;
        the sampled ids are dropped, so the pool, the state slots and the next step's inputs are as before."""
        c, seq = self.cache_cfg, self.scratch_seq
        budget, max_len = c.max_num_batched_tokens, self.model_cfg.max_model_len
        num_decodes = max(0, min(MIXED_STEP_DECODES, c.max_num_seqs - 1, budget - 1, max_len - 32))
        prompt = seq(num_decodes, min(64, budget - num_decodes, max_len), 0)
        steps = [[seq(i, 1, 31) for i in range(num_decodes)] + [prompt]]
        if min(budget, max_len - 1) > 512:
            steps.append([seq(0, min(budget, max_len - 1, 640), 0)])
        for seqs in steps:  # eager (graphs would take these); result() waits for the step's sampled ids
            self._launch_eager(SchedulerOutput(seqs, sum(len(s.token_ids) for s in seqs), [])).result()
        self._last_token_ids, self._last_req_ids = None, []

    def scratch_seq(self, i: int, n: int, start: int) -> ScheduledSeq:
        """A greedy sequence of n tokens (id 0) from position start whose KV goes into the scratch block 0 of every
        KV group and whose recurrent state goes into the scratch slot (read from it unless start is 0): the start-up
        warm-up's steps and benchmarks/mixed_step.py's, which leave the pool and the state slots as they were."""
        from ember.sampling_params import SamplingParams

        blocks = [0] * -(-(start + n) // self.block_size)
        scratch = self.state_cache.scratch_slot if self.state_cache.layers else None
        state = None if scratch is None else StateStep(read_slot=-1 if start == 0 else scratch, write_slot=scratch)
        groups = [blocks] * (len(self.kv_groups) - 1) if len(self.kv_groups) > 1 else None
        return ScheduledSeq(f"scratch-{i}", [0] * n, start, blocks, True, SamplingParams(temperature=0.0, max_tokens=1),
                            0, [0] * (start + n), [], [], state, groups)

    def make_graph_runner(self, max_num_seqs: int, use_graphs: bool = True,
                          token_sizes: tuple[int, ...] | None = None) -> CudaGraphRunner:
        """Static buffers for this model's KV groups and state slots (use_graphs=False: no capture); decode steps
        up to max_num_seqs sequences, mixed steps of token_sizes tokens (default: mixed_token_sizes)."""
        max_blocks = -(-self.model_cfg.max_model_len // self.block_size)
        scratch = self.state_cache.scratch_slot if self.state_cache.layers else None
        # the recurrent layers' conv window, which their chunk plans are laid out by
        width = next((t.shape[-1] for spec in self.cache_specs if isinstance(spec, RecurrentStateSpec)
                      for t in spec.tensors if t.name == "conv"), None)
        return CudaGraphRunner(self.model, max_num_seqs, max_blocks, self.block_size, self.device,
                               max(1, len(self.kv_groups)), scratch, use_graphs, self._fill_placeholders,
                               self.mixed_token_sizes(max_blocks) if token_sizes is None else token_sizes, width,
                               (self.vocab_size, self.dtype))

    def mixed_token_sizes(self, max_blocks: int) -> tuple[int, ...]:
        """Token counts of the mixed-step graphs: GRAPH_TOKEN_SIZES within the token budget and the block tables'
        width, below the length from which a sequence's prefill goes to flash attention (a captured step cannot
        route by length), the last one raised to that limit; none with EMBER_MIXED_GRAPHS=0, nor for a model with
        recurrent state whose chunked Gated DeltaNet ops are torch references (they plan on the host)."""
        if os.environ.get("EMBER_MIXED_GRAPHS", "1") == "0":
            return ()
        if self.state_cache.layers and not ops.triton_enabled(*(f.__name__ for f in ops.GATED_DELTA_CHUNKED.values())):
            return ()
        limit = min(self.cache_cfg.max_num_batched_tokens, max_blocks * self.block_size, GRAPH_TOKEN_SIZES[-1])
        if ops.triton_enabled():
            from ember.ops.triton.attention import FLASH_PREFILL_MIN_QUERY
            if FLASH_PREFILL_MIN_QUERY > 0:
                limit = min(limit, FLASH_PREFILL_MIN_QUERY - 1)
        return tuple(t for t in GRAPH_TOKEN_SIZES if t < limit) + ((limit,) if limit >= GRAPH_TOKEN_SIZES[0] else ())

    @property
    def kv_bytes_per_token(self) -> int:
        """Per token of group 0 (full attention, or the only sliding window): what the block pool is sized by."""
        return self.kv_groups[0].bytes_per_token(self.cache_specs, self.kv_dtype) if self.kv_groups else 0

    def _sliding_blocks(self, window: int) -> int:
        c = self.cache_cfg
        return sliding_group_blocks(window, self.block_size, c.max_num_seqs, c.max_num_batched_tokens)

    @property
    def sliding_bytes(self) -> int:
        """Memory of the sliding-window groups after the first, capped by their windows, not by the context."""
        return sum(self._sliding_blocks(g.window) * self.block_size
                   * g.bytes_per_token(self.cache_specs, self.kv_dtype) for g in self.kv_groups[1:])

    @property
    def state_bytes(self) -> int:
        """Recurrent-state memory of hybrid models: every slot's state over all layers."""
        num_slots = self.cache_cfg.num_state_slots or 0
        return state_bytes_per_slot(self.cache_specs, self.dtype) * (num_slots + 1 if num_slots else 0)  # + scratch

    def _cache_budget(self) -> float:
        """Bytes for the KV pool, recurrent state and sliding windows together."""
        if self.cache_cfg.kv_cache_gb is not None:
            return self.cache_cfg.kv_cache_gb * 2**30
        if self.device.type == "cuda":
            return self._gpu_available() * self.cache_cfg.gpu_memory_utilization - self.activation_reserve
        return CPU_DEFAULT_KV_GB * 2**30

    @property
    def activation_reserve(self) -> int:
        return activation_reserve(self.model_cfg.hf_config, self.cache_cfg.max_num_batched_tokens, self.dtype.itemsize)

    def _gpu_available(self) -> float:
        """Free device memory, after handing back what torch's caching allocator holds unused: an engine dropped
        earlier in the process leaves its pool there, and the driver reports it as in use. (Counting the cache's
        unused bytes as free instead overcounts: some sit in segments that live tensors share.)"""
        gc.collect()  # a dropped engine in a reference cycle frees its tensors now
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return free

    def _fit_max_num_batched_tokens(self, budget: float) -> float:
        """Halves a default token budget while its activation reserve takes over FIT_RESERVE_SHARE of the memory
        the reserve and the cache divide, as long as halving shrinks the reserve; returns the cache budget left
        beside the reserve of the budget kept. Every rank agrees on the smallest."""
        c = self.cache_cfg
        if self.device.type != "cuda" or c.kv_cache_gb is not None:
            return budget
        shared = budget + self.activation_reserve
        while c.max_num_batched_tokens > FIT_MIN_TOKENS and self.activation_reserve > FIT_RESERVE_SHARE * shared:
            tokens, reserve = c.max_num_batched_tokens, self.activation_reserve
            c.max_num_batched_tokens = max(FIT_MIN_TOKENS, tokens // 2)
            if self.activation_reserve == reserve:  # at the reserve's floor: a smaller budget frees nothing
                c.max_num_batched_tokens = tokens
                break
        c.max_num_batched_tokens = get_tp().min_int(c.max_num_batched_tokens, self.device)
        return shared - self.activation_reserve

    def _fit_max_num_seqs(self, budget: float) -> None:
        """Halves a default max_num_seqs (and the state slots with it, per sequence as many as before) while the
        per-sequence caches exceed FIT_FIXED_SHARE of the budget; every rank agrees on the smallest."""
        c = self.cache_cfg
        slots_per_seq = (c.num_state_slots or 0) // c.max_num_seqs
        while c.max_num_seqs > FIT_MIN_SEQS and self.state_bytes + self.sliding_bytes > FIT_FIXED_SHARE * budget:
            c.max_num_seqs = max(FIT_MIN_SEQS, c.max_num_seqs // 2)
            c.num_state_slots = slots_per_seq * c.max_num_seqs or c.num_state_slots
        c.max_num_seqs = get_tp().min_int(c.max_num_seqs, self.device)
        c.num_state_slots = slots_per_seq * c.max_num_seqs or c.num_state_slots

    def _size_pool(self, budget: float) -> int:
        """Blocks of the KV pool within `budget` (_cache_budget) once the per-sequence caches are taken."""
        per_block = max(1, self.kv_bytes_per_token * self.block_size)
        fixed = self.state_bytes + self.sliding_bytes
        if self.cache_cfg.kv_cache_gb is None and self.device.type == "cuda" and budget - fixed < 64 * per_block:
            # the free memory the budget was taken from
            reserve = self.activation_reserve
            free = (budget + reserve) / self.cache_cfg.gpu_memory_utilization / 2**30
            total = torch.cuda.get_device_properties(self.device).total_memory / 2**30
            raise ValueError(
                f"no room for a KV cache on {self.device}: {free:.2f} of its {total:.2f} GiB are free after loading "
                f"the model, of which gpu_memory_utilization={self.cache_cfg.gpu_memory_utilization} less "
                f"{reserve / 2**30:.2f} GiB for the activations of a {self.cache_cfg.max_num_batched_tokens}-token "
                f"step leaves {budget / 2**30:.2f} GiB. Another engine (in this process or another) may hold the "
                "memory; close it, lower max_num_batched_tokens, or set kv_cache_gb")
        if fixed > budget / 2:
            raise ValueError(f"recurrent state ({self.state_bytes / 2**30:.2f} GiB for {self.cache_cfg.num_state_slots} "
                             f"slots) and sliding windows ({self.sliding_bytes / 2**30:.2f} GiB) need over half of the "
                             f"{budget / 2**30:.2f} GiB cache budget; lower max_num_seqs or give the cache more memory")
        if self.kv_bytes_per_token == 0:  # recurrent layers only: blocks hold no KV and only count tokens
            return 2 * self.cache_cfg.max_num_seqs * -(-self.model_cfg.max_model_len // self.block_size) + 1
        return max(2, int((budget - fixed) // per_block))

    def _allocate_kv(self) -> list[torch.Tensor]:
        caches: list[torch.Tensor] = []
        for spec, group in zip(self.cache_specs, self.layer_groups):
            if isinstance(spec, SharedKVSpec):
                caches.append(caches[spec.donor_layer])
                continue
            if isinstance(spec, RecurrentStateSpec):  # state slots, see _allocate_state
                caches.append(None)
                continue
            shape = (2, self.group_num_blocks[group], self.block_size, spec.num_kv_heads, spec.head_dim)
            caches.append(torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
        return caches

    def _allocate_state(self) -> StateCache:
        state = StateCache(self.cache_specs, self.cache_cfg.num_state_slots or 0, self.dtype, self.device)
        layers = self.model.attention_layers()
        for i, tensors in state.layers.items():
            layers[i].state = tensors
        return state

    def _prepare(self, out: SchedulerOutput) -> StepInputs:
        seqs, bs = out.seqs, self.block_size
        lens = [len(seq.token_ids) for seq in seqs]
        start_pos = [seq.start_pos for seq in seqs]
        starts = [0, *itertools.accumulate(lens)]
        seq_lens = [s + n for s, n in zip(start_pos, lens)]
        sampled = [i for i, seq in enumerate(seqs) if seq.do_sample]
        sample_idx = [starts[i + 1] - 1 for i in sampled]
        max_blocks = max(-(-s // bs) for s in seq_lens)
        tables = padded_tables([seq.block_ids for seq in seqs], max_blocks)
        token_seq, positions = step_positions(start_pos, lens)
        slots = token_slots(tables, token_seq, positions, bs)
        input_ids = np.fromiter(itertools.chain.from_iterable(seq.token_ids for seq in seqs), np.int64, count=starts[-1])
        dev = self.device

        def t(x, dtype):
            return _device_tensor(x, dtype, dev)

        ids = t(input_ids, torch.int64)
        self._fill_placeholders(ids, seqs, starts[1:])
        meta = AttentionMetadata(
            slot_mapping=t(slots, torch.int64), query_start_loc=t(starts, torch.int32), seq_lens=t(seq_lens, torch.int32),
            block_tables=t(tables, torch.int32), max_query_len=max(lens),
            max_seq_len=max(seq_lens), query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
            state=_to_device(StateMetadata.build(seqs, torch.device("cpu")), dev),  # no sync: a step may run
            sample_seq_idx=sampled,
        )
        if len(self.kv_groups) > 1:
            meta.groups = [meta] + [self._group_meta(meta, out, g, t, max_blocks, token_seq, positions)
                                    for g in range(1, len(self.kv_groups))]
        return StepInputs(ids, t(positions, torch.int64), meta, t(sample_idx, torch.int64), [seqs[i] for i in sampled])

    def _group_meta(self, meta: AttentionMetadata, out: SchedulerOutput, group: int, t, width: int,
                    token_seq: np.ndarray, positions: np.ndarray) -> AttentionMetadata:
        """The step's metadata with KV group `group`'s slots and block tables (width blocks; the step's tokens as
        step_positions gives them)."""
        tables = padded_tables([seq.group_block_ids[group - 1] for seq in out.seqs], width)
        slots = token_slots(tables, token_seq, positions, self.block_size)
        return replace(meta, slot_mapping=t(slots, torch.int64), block_tables=t(tables, torch.int32), groups=None, derived={})

    def _fill_placeholders(self, input_ids: torch.Tensor, seqs: list[ScheduledSeq], ends) -> None:
        """Writes the last launched step's samples into the rows of input_ids that feed them as placeholders (the
        last token of a chunk; ends[i] is one past seq i's last row). A device gather and copy: no host sync."""
        rows, src_req_ids = [], []
        for seq, end in zip(seqs, ends):
            if seq.token_ids[-1] == PLACEHOLDER_TOKEN_ID:
                rows.append(end - 1)
                src_req_ids.append(seq.req_id)
        if not rows:
            return
        assert self._last_token_ids is not None, "a placeholder token without a launched step to take it from"
        if src_req_ids == self._last_req_ids and rows[-1] == len(rows) - 1:  # steady decode: rows 0.., in order
            input_ids[:len(rows)].copy_(self._last_token_ids)
            return
        index = {req_id: i for i, req_id in enumerate(self._last_req_ids)}
        src = _device_tensor([index[r] for r in src_req_ids], torch.int64, self.device)
        rows_dev = _device_tensor(rows, torch.int64, self.device)
        input_ids.index_copy_(0, rows_dev, self._last_token_ids.index_select(0, src))

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """launch + result: one step in serial order."""
        return self.launch(out).result()

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> StepHandle:
        """Enqueues the step's forward and sampling; returns before the device has run them."""
        if self.graphs is not None and self.graphs.can_run(out.seqs):
            logits = self.graphs.run(out.seqs)
            self._copy_decode_snapshots(out.seqs)
            return self._sample(logits, out.seqs, StepHandle(out.seqs))
        t = self.graphs.mixed_size(out.seqs, out.num_batched_tokens) if self.graphs is not None else None
        if t is not None:
            handle = StepHandle([seq for seq in out.seqs if seq.do_sample])
            return self._sample(self.graphs.run_mixed(out.seqs, t, out.num_batched_tokens), handle.sample_seqs, handle)
        return self._launch_eager(out)

    @torch.inference_mode()
    def _launch_eager(self, out: SchedulerOutput) -> StepHandle:
        inputs = self._prepare(out)
        # the hidden states of the sampled rows alone where no prompt logprobs need the others (out_rows in
        # ember/layers/decoder.py): the last layer's MLP skips the rest
        rows = inputs.sample_idx
        if len(rows) == len(inputs.input_ids) or any(s.wants_prompt_logprobs for s in out.seqs):
            rows = None
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, rows)
        if inputs.meta.is_decode_only:  # prefill chunks took their snapshots inside the layers
            self._copy_decode_snapshots(out.seqs)
        handle = StepHandle(inputs.sample_seqs)
        if rows is None:
            self._prompt_logprobs(out, hidden, inputs, handle.prompt_logprobs)
            hidden = hidden[inputs.sample_idx]
        logits = self.model.compute_logits(hidden) if inputs.sample_seqs else None
        return self._sample(logits, inputs.sample_seqs, handle)

    def _copy_decode_snapshots(self, seqs: list[ScheduledSeq]) -> None:
        """A decode step's snapshots: each working slot with one due is copied into its snapshot slot (the state
        after the step's one token), in every recurrent layer at once."""
        pairs = [(s.state.write_slot, slot) for s in seqs if s.state is not None for _, slot in s.state.snapshots]
        if pairs:
            src, dst = zip(*pairs)
            self.state_cache.copy_slots(_device_tensor(src, torch.int64, self.device),
                                        _device_tensor(dst, torch.int64, self.device))

    def _sample(self, logits: torch.Tensor | None, seqs: list[ScheduledSeq], handle: StepHandle) -> StepHandle:
        """Samples on the device, keeps the ids there for the next step's placeholders and starts their copy to
        the host (with logprobs), behind an event on CUDA. No seqs (prompt chunks only): nothing to sample or keep."""
        if not seqs:
            self._last_token_ids, self._last_req_ids = None, []
            return handle
        lp = None
        if all(_is_plain_greedy(s) for s in seqs):  # the sampler would take the argmax: skip its metadata
            token_ids = ops.row_argmax(logits)  # in the model dtype: float32 would round-trip the same values
        else:
            logits = logits.float()
            # len(output_token_ids) counts a placeholder of the step before, so the noise counter is the serial one
            rows = [
                SamplingRow(s.params, s.seed, len(s.output_token_ids), s.prompt_token_ids, s.output_token_ids,
                            (s.eos_token_ids if not s.params.ignore_eos else []) + s.params.stop_token_ids)
                for s in seqs
            ]
            # built on the host and copied asynchronously: no sync while the forward may still run
            meta = SamplingMetadata.build(rows, logits.shape[-1], "cpu")
            sampled = self.sampler(logits, _to_device(meta, self.device))
            token_ids, lp = sampled.sampled_token_ids, sampled.logprobs
        self._last_token_ids, self._last_req_ids = token_ids, [s.req_id for s in seqs]
        handle.token_ids = _to_host(token_ids)
        if lp is not None:
            handle.logprobs = LogprobsTensors(_to_host(lp.token_ids), _to_host(lp.logprobs), _to_host(lp.ranks))
        if self.device.type == "cuda":
            handle.ready = torch.cuda.Event()
            handle.ready.record()
        return handle

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor, inputs: StepInputs,
                         result: dict[str, list[TokenLogprobs]]) -> None:
        """Read to the host here (a sync): the engine runs steps with prompt logprobs in serial order."""
        start_row = 0
        for seq in out.seqs:
            n = len(seq.token_ids)
            k = seq.params.prompt_logprobs
            num_prompt = len(seq.prompt_token_ids)
            # positions p in this chunk whose next token is a prompt token
            last = min(seq.start_pos + n, num_prompt - 1)
            if k is not None and seq.start_pos < last:
                count = last - seq.start_pos
                targets = torch.tensor(seq.prompt_token_ids[seq.start_pos + 1:last + 1], device=self.device)
                rows = result[seq.req_id] = []
                for a in range(0, count, PROMPT_LOGPROBS_ROWS):  # a bounded slice of [count, vocab] logits at a time
                    b = min(count, a + PROMPT_LOGPROBS_ROWS)
                    logits = self.model.compute_logits(hidden[start_row + a:start_row + b]).float()
                    rows += _rows(compute_logprobs(logits, targets[a:b], k), b - a)
            start_row += n
