"""The offline Python API, in the convention users know from vLLM: LLM(model).generate(prompts, params)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import array
import gc
import itertools
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from ember.config import CacheConfig, ModelConfig, SchedulerConfig, default_max_num_batched_tokens, default_max_num_seqs
from ember.engine.core import EngineCore
from ember.engine.outputs import CompletionOutput, RequestOutput
from ember.sampling_params import SamplingParams

Prompt = str | list[int]

if TYPE_CHECKING:
    from ember.tokenizer.tokenizer import Tokenizer


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The i-th of n samples: its own seed (seed + i when seeded), n=1."""
    seed = None if params.seed is None else params.seed + index
    return params.replace(n=1, seed=seed)


def _describe(prompt) -> str:
    """What a rejected prompt is: its type, or a list's first element that is no integer token id."""
    if isinstance(prompt, (list, tuple)):
        for i, t in enumerate(prompt):
            try:
                array.array("q", [t])
            except (TypeError, OverflowError):
                return f"a {type(prompt).__name__} whose element {i} is {t!r}"
    return type(prompt).__name__


class LLM:
    def __init__(self, model: str | Path | None = None, *, dtype: str = "auto", device: str | None = None,
                 max_model_len: int | None = None, kv_cache_gb: float | None = None, block_size: int = 16,
                 enable_prefix_caching: bool = True, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None,
                 load_format: str = "safetensors", seed: int = 0, progress: bool = True,
                 tensor_parallel_size: int = 1, async_scheduling: bool = True,
                 ssm_state_dtype: str = "float32", kv_cache_dtype: str = "auto") -> None:
        if model is None:
            from ember.demo import demo_model_dir
            model = demo_model_dir()
        model_cfg = ModelConfig.from_dir(model, dtype, device, max_model_len, load_format, seed)
        tokenizer = None
        if (Path(model_cfg.model) / "tokenizer.json").is_file():
            from ember.tokenizer.tokenizer import Tokenizer
            tokenizer = Tokenizer.from_dir(model_cfg.model)
        cache_cfg = CacheConfig(block_size=block_size, kv_cache_gb=kv_cache_gb,
                                enable_prefix_caching=enable_prefix_caching, fit_max_num_seqs=max_num_seqs is None,
                                fit_max_num_batched_tokens=max_num_batched_tokens is None,
                                ssm_state_dtype=ssm_state_dtype, kv_cache_dtype=kv_cache_dtype)
        if max_num_seqs is None:  # by device: 256 on a GPU, 64 on CPU; lowered by the runner where memory is short
            max_num_seqs = default_max_num_seqs(model_cfg.device)
        if max_num_batched_tokens is None:  # by device: 32768 on an H100/H200-class GPU, 2048 on CPU; lowered by
            # the runner where a step's activations would crowd out the KV cache
            max_num_batched_tokens = default_max_num_batched_tokens(model_cfg.device)
        sched_cfg = SchedulerConfig(max_num_seqs, max_num_batched_tokens, model_cfg.max_model_len,
                                    async_scheduling=async_scheduling)
        self.engine = EngineCore(model_cfg, cache_cfg, sched_cfg, tokenizer, progress, tensor_parallel_size)
        self.tokenizer = tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError("this model directory has no tokenizer.json; pass prompt token ids instead of text")
        return self.tokenizer

    def _encode(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.get_tokenizer().encode(prompt)
        if isinstance(prompt, (list, tuple)):
            try:  # every id an integer (numpy's too), checked in C: a per-token isinstance cost ~4 ms per 32k ids
                return None, array.array("q", prompt).tolist()
            except (TypeError, OverflowError):
                pass
        raise TypeError(f"a prompt must be a string or a list of token ids, got {_describe(prompt)}")

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None:
            params = self.engine.default_sampling_params()
        param_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(param_list) != len(prompts):
            raise ValueError(f"got {len(param_list)} SamplingParams for {len(prompts)} prompts")
        # validate everything before any request is queued, so a bad prompt leaves nothing half-added
        encoded = [self._encode(p) for p in prompts]
        max_tokens = [self.engine.validate(ids, p) for (_, ids), p in zip(encoded, param_list)]
        results, children = [], {}
        for (text, ids), p, limit in zip(encoded, param_list, max_tokens):
            out = RequestOutput(str(next(self._ids)), text, ids, [CompletionOutput(i) for i in range(p.n)])
            results.append(out)
            for i in range(p.n):
                child_id = f"{out.request_id}-{i}"
                # n=1: the request's own params (nothing downstream mutates them; a deep copy per request cost
                # ~10 ms before the first step of a 256-prompt batch)
                self.engine.add_validated(child_id, ids, p if p.n == 1 else child_params(p, i), limit)
                children[child_id] = (out, i)
        self._run(children, use_tqdm)
        return results

    def _run(self, children: dict, use_tqdm: bool) -> None:
        bar = tqdm(total=len(children), desc="Generating", disable=not use_tqdm)
        # the heap alive now stays out of the cyclic GC until the call returns: a full collection walking it stalled
        # 256-sequence H200 runs for 90-200 ms mid-decode. Thawed afterwards, so a dropped LLM is still collected
        # (`ember serve` freezes once after start-up instead, engine.core.freeze_gc_heap). Frozen whatever was
        # frozen before (on the H200 something had frozen 375 objects, and the other ~245,000 were walked), and
        # so thawed entirely after: freezing only spares the collector work, thawing never changes what is freed.
        gc.freeze()
        try:
            self._steps(children, bar)
        finally:
            gc.unfreeze()
            bar.close()

    def _steps(self, children: dict, bar) -> None:
        while self.engine.has_unfinished():
            for delta in self.engine.step():
                out, index = children[delta.req_id]
                out.outputs[index].apply(delta)
                if delta.prompt_logprobs is not None:
                    out.prompt_logprobs = delta.prompt_logprobs
                out.num_cached_tokens = delta.num_cached_tokens
                if delta.finished:
                    bar.update(1)
                    out.finished = all(o.finish_reason is not None for o in out.outputs)

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None, *,
             tools: list[dict] | None = None, enable_thinking: bool | None = None) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.get_tokenizer()
        prompts = [tok.encode_chat(conv, tools=tools, add_generation_prompt=True, enable_thinking=enable_thinking)
                   for conv in conversations]
        return self.generate(prompts, params)
