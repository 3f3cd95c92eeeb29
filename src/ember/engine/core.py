"""EngineCore: the step loop, on one thread. Serial order: schedule -> execute -> update -> detokenize. With async
scheduling (the default) the host work of a step overlaps the device's previous one (see EngineCore.step)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import gc
import json
import logging
import secrets
from pathlib import Path

from ember.config import CacheConfig, ModelConfig, SchedulerConfig
from ember.engine.output_processor import OutputProcessor
from ember.engine.outputs import RequestDelta
from ember.engine.scheduler import Scheduler, SchedulerOutput
from ember.kv.block_pool import BlockPool
from ember.kv.managers import BlockGroup, KVCacheManager
from ember.kv.prefix_hash import cache_namespace, file_fingerprint
from ember.kv.state_pool import RecurrentStatePool
from ember.request import Request, RequestStatus
from ember.sampling_params import SamplingParams
from ember.worker.model_runner import ModelRunner, ModelRunnerOutput, StepHandle

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ember.tokenizer.tokenizer import Tokenizer


def read_generation_config(model_dir: str) -> dict:
    path = Path(model_dir) / "generation_config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def freeze_gc_heap() -> None:
    """Moves everything alive now (torch, the model, the engine) out of the cyclic GC's reach, as vLLM does once
    a server has started: a full collection then walks only what was allocated since. Without it, at 256
    decoding sequences one walks ~180k start-up objects every ~200 steps. For a process that keeps one engine:
    frozen objects are never collected if they later become garbage inside a reference cycle."""
    gc.collect()  # first, or today's garbage would be frozen too
    gc.freeze()


def _as_list(x) -> list[int]:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


class EngineCore:
    def __init__(self, model_cfg: ModelConfig, cache_cfg: CacheConfig | None = None,
                 sched_cfg: SchedulerConfig | None = None, tokenizer: Tokenizer | None = None,
                 progress: bool = True, tensor_parallel_size: int = 1) -> None:
        self.model_cfg = model_cfg
        self.cache_cfg = cache_cfg or CacheConfig()
        self.sched_cfg = sched_cfg or SchedulerConfig(max_model_len=model_cfg.max_model_len)
        self.sched_cfg.max_model_len = min(self.sched_cfg.max_model_len, model_cfg.max_model_len)
        self.tokenizer = tokenizer
        self.cache_cfg.max_num_seqs = self.sched_cfg.max_num_seqs  # bounds fixed per-request caches
        self.cache_cfg.max_num_batched_tokens = self.sched_cfg.max_num_batched_tokens
        if self.cache_cfg.num_state_slots is None:  # hybrid models: a slot per running request (+ as many snapshots)
            self.cache_cfg.num_state_slots = self.sched_cfg.max_num_seqs * (2 if self.cache_cfg.enable_prefix_caching else 1)
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must be >= 1")
        if tensor_parallel_size > 1:
            from ember.worker.tp_executor import TPExecutor
            self.runner = TPExecutor(model_cfg, self.cache_cfg, tensor_parallel_size, progress)
        else:
            self.runner = ModelRunner(model_cfg, self.cache_cfg, progress)
        if self.cache_cfg.max_num_seqs < self.sched_cfg.max_num_seqs:  # a default the runner fitted to memory
            log.info("max_num_seqs %d -> %d: the per-request caches (recurrent state, sliding windows) of more would "
                     "take over a quarter of the cache memory", self.sched_cfg.max_num_seqs, self.cache_cfg.max_num_seqs)
            self.sched_cfg.max_num_seqs = self.cache_cfg.max_num_seqs
        if self.cache_cfg.max_num_batched_tokens < self.sched_cfg.max_num_batched_tokens:  # a default, fitted
            log.info("max_num_batched_tokens %d -> %d: the activations of a larger step would take over an eighth of "
                     "the memory the KV cache and they share", self.sched_cfg.max_num_batched_tokens,
                     self.cache_cfg.max_num_batched_tokens)
            self.sched_cfg.max_num_batched_tokens = self.cache_cfg.max_num_batched_tokens
        self.generation_config = read_generation_config(model_cfg.model)
        self.eos_token_ids = sorted(set(_as_list(self.generation_config.get("eos_token_id"))
                                        + _as_list(tokenizer.eos_token_id if tokenizer else None)
                                        + _as_list(model_cfg.hf_config.get("eos_token_id"))))
        extra = f"dummy:{model_cfg.seed}" if model_cfg.load_format == "dummy" else ""
        kv_dtype = self.cache_cfg.kv_dtype(model_cfg.dtype)  # KV stored in another dtype is another codec
        codec = "none" if kv_dtype == model_cfg.dtype else str(kv_dtype).removeprefix("torch.")
        self.namespace = cache_namespace(file_fingerprint(model_cfg.model, extra), str(model_cfg.dtype), codec)
        self.kv = self._kv_manager()
        self.scheduler = Scheduler(self.sched_cfg, self.kv)
        self.outputs = OutputProcessor(tokenizer)
        # needs a runner that launches without waiting; the tensor-parallel executor runs steps in serial order (its
        # __getattr__ forwards to rank 0's ModelRunner, so supports_async_scheduling alone would read True there)
        self.is_async = (self.sched_cfg.async_scheduling and tensor_parallel_size == 1
                         and getattr(self.runner, "supports_async_scheduling", False))
        self._in_flight: tuple[SchedulerOutput, StepHandle] | None = None  # launched and advanced, not completed

    def _kv_manager(self) -> KVCacheManager:
        """One block pool per KV group of the runner (full attention, then each sliding window)."""
        caching = self.cache_cfg.enable_prefix_caching
        windows = [g.window for g in getattr(self.runner, "kv_groups", [])] or [None]
        sizes = getattr(self.runner, "group_num_blocks", [self.runner.num_blocks])
        sliding = [BlockGroup(BlockPool(n, caching), w) for n, w in zip(sizes[1:], windows[1:])]
        return KVCacheManager(BlockPool(sizes[0], caching), self.cache_cfg.block_size, self.namespace,
                              self._state_pool(), windows[0], sliding)

    def _state_pool(self) -> RecurrentStatePool | None:
        if not getattr(self.runner, "state_bytes", 0):  # attention-only model (or a runner without state)
            return None
        num_working = self.sched_cfg.max_num_seqs
        if self.cache_cfg.num_state_slots < num_working:
            raise ValueError(f"num_state_slots={self.cache_cfg.num_state_slots} must be >= max_num_seqs={num_working}")
        return RecurrentStatePool(num_working, self.cache_cfg.num_state_slots - num_working)

    @property
    def max_model_len(self) -> int:
        return self.sched_cfg.max_model_len

    def default_sampling_params(self) -> SamplingParams:
        """The model's generation_config.json sampling defaults, as vLLM applies them."""
        g = self.generation_config
        keys = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty"}
        kwargs = {ours: g[theirs] for ours, theirs in keys.items() if g.get(theirs) is not None}
        if g.get("do_sample") is False:
            kwargs["temperature"] = 0.0
        return SamplingParams(**kwargs)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Checks a request against the model; returns its resolved max_tokens."""
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty; give at least one token")
        vocab = self.runner.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:  # builtins first: the common case is fast
            bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        params.validate_for_vocab(vocab)
        if n >= self.max_model_len:
            raise ValueError(f"the prompt has {n} tokens but the context window is {self.max_model_len}; "
                             "it must leave room for at least one generated token")
        room = self.max_model_len - n
        max_tokens = room if params.max_tokens is None else params.max_tokens
        if max_tokens > room:
            raise ValueError(f"max_tokens={max_tokens} plus the prompt's {n} tokens exceeds the context window "
                             f"of {self.max_model_len}; at most {room} tokens can be generated")
        if not self.kv.can_ever_fit(n + max_tokens):
            raise ValueError(f"a request of {n + max_tokens} tokens can never fit the KV pool of "
                             f"{(self.kv.pool.num_blocks - 1) * self.kv.block_size} tokens; lower max_tokens or "
                             "give the cache more memory (--kv-cache-gb)")
        return max_tokens

    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.add_validated(req_id, prompt_token_ids, params, self.validate(prompt_token_ids, params))

    def add_validated(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                      max_tokens: int) -> None:
        """add_request for a prompt that validate() passed, returning max_tokens (LLM.generate checks a whole batch
        before it queues any; checking each prompt again cost ~9 us of host time per prompt before the first step)."""
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        request = Request(req_id, list(prompt_token_ids), params, seed, self.eos_token_ids, max_tokens)
        self.scheduler.add_request(request)
        self.outputs.add(request)

    def abort(self, req_id: str) -> RequestDelta | None:
        """Ends a request and frees its blocks; returns its final delta (with any held-back text), or None
        if it was not running."""
        request = self.scheduler.finish(req_id, RequestStatus.FINISHED_ABORTED)
        delta = self.outputs.delta(request, []) if request is not None and req_id in self.outputs.states else None
        self.outputs.remove(req_id)
        return delta

    def close(self) -> None:
        """Stops tensor-parallel worker processes, if any."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0 or self._in_flight is not None

    def step(self) -> list[RequestDelta]:
        """Schedules and launches step n; with async scheduling, then finishes step n-1 while the device runs n
        and returns n-1's deltas. The scheduler sees n-1's samples as placeholders, which the runner fills on the
        device. Steps that cannot overlap (penalties, prompt logprobs; no async runner) run in serial order."""
        out = self.scheduler.schedule()
        if not self.is_async or out.is_empty or not self.scheduler.can_overlap(out):
            deltas = self._finish_in_flight()
            if not out.is_empty:
                result = self.runner.execute(out)
                self.scheduler.advance(out)
                deltas += self._process(out, result)
            return deltas
        handle = self.runner.launch(out)
        deltas = self._finish_in_flight()  # the one wait: for step n-1, while the device runs step n
        self.scheduler.advance(out)
        self._in_flight = (out, handle)
        return deltas

    def _finish_in_flight(self) -> list[RequestDelta]:
        if self._in_flight is None:
            return []
        out, handle = self._in_flight
        self._in_flight = None
        return self._process(out, handle.result())

    def _process(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[RequestDelta]:
        """A step's tokens into the scheduler (stops, caching, frees) and the output processor (text, deltas)."""
        for req_id, rows in result.prompt_logprobs.items():
            if req_id in self.outputs.states:
                self.outputs.add_prompt_logprobs(req_id, rows)
        updated = self.scheduler.complete(out, result.sampled)
        deltas = []
        for request in updated:
            lp = result.logprobs.get(request.req_id)
            stop = self.outputs.process(request, request.output_token_ids[-1], lp)
            if stop is not None:
                self.scheduler.finish(request.req_id, RequestStatus.FINISHED_STOPPED, stop)
            deltas.append(self.outputs.delta(request, (lp,) if lp is not None else ()))
            if request.is_finished:
                self.outputs.remove(request.req_id)
        return deltas
