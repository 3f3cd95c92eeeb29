"""Per-request sampling parameters, following vLLM's `SamplingParams` convention.

Plain python on purpose (no torch): the server builds these from JSON, and the
sampler turns a batch of them into tensors in `ember.sample.metadata`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

MAX_LOGPROBS = 20
# Seeds are folded into int64 for the device hash, so accept both signed and unsigned 64-bit.
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_real(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> None:
    """Raise unless `value` is a finite number in [lo, hi] (or (lo, hi] with lo_open)."""
    if not _is_real(value):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    in_range = (lo < value if lo_open else lo <= value) and value <= hi
    if not (math.isfinite(value) and in_range):
        lo_text = f"({lo}" if lo_open else f"[{lo}"
        raise ValueError(f"{name} must be in {lo_text}, {hi}], got {value!r}")


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    """Raise unless `value` is an int in [lo, hi] (hi=None: no upper bound)."""
    if not _is_int(value):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _normalise_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    elif not isinstance(stop, (list, tuple)):
        raise ValueError(f"stop must be a str, a list of str or None, got {type(stop).__name__}")
    for item in stop:
        if not isinstance(item, str):
            raise ValueError(f"stop must contain only str, got {type(item).__name__} {item!r}")
        if not item:
            raise ValueError("stop strings must be non-empty, got ''")
    return list(stop)


def _normalise_token_ids(name: str, ids: Any) -> list[int]:
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"{name} must be a list of int or None, got {type(ids).__name__}")
    for token_id in ids:
        _check_int(f"{name} entry", token_id, 0)
    return list(ids)


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request's completion (vLLM / OpenAI semantics).

    temperature=0 or top_k=1 is greedy. top_k=-1 is accepted as "off" and stored as 0.
    stop / stop_token_ids are normalised to lists. Token ids in logit_bias and
    stop_token_ids are checked against the model with `validate_for_vocab`.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self._validate_sampling()
        self._validate_penalties()
        self._validate_lengths()
        if self.seed is not None:
            _check_int("seed", self.seed, _SEED_MIN, _SEED_MAX)
        self.stop = _normalise_stop(self.stop)
        self.stop_token_ids = _normalise_token_ids("stop_token_ids", self.stop_token_ids)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, 0, MAX_LOGPROBS)

    def _validate_sampling(self) -> None:
        _check_int("n", self.n, 1)
        _check_real("temperature", self.temperature, 0.0, math.inf)
        _check_real("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if not _is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 0):
            raise ValueError(f"top_k must be an int, 0 or -1 (off) or >= 1, got {self.top_k!r}")
        if self.top_k == -1:
            self.top_k = 0
        _check_real("min_p", self.min_p, 0.0, 1.0)

    def _validate_penalties(self) -> None:
        _check_real("repetition_penalty", self.repetition_penalty, 0.0, math.inf, lo_open=True)
        _check_real("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_real("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict[int, float] or None, got {type(self.logit_bias).__name__}")
        for token_id, bias in self.logit_bias.items():
            _check_int("logit_bias key", token_id, 0)
            _check_real(f"logit_bias[{token_id}]", bias, -100.0, 100.0)

    def _validate_lengths(self) -> None:
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if a token id in logit_bias or stop_token_ids is outside [0, vocab_size)."""
        for name, ids in (("logit_bias", self.logit_bias or {}), ("stop_token_ids", self.stop_token_ids)):
            for token_id in ids:
                if not 0 <= token_id < vocab_size:
                    raise ValueError(
                        f"{name} token id {token_id} is out of range: must be in [0, {vocab_size})"
                    )

    def clone(self) -> SamplingParams:
        """A deep copy: lists and the logit_bias dict are not shared."""
        return copy.deepcopy(self)

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with `changes` applied and validated again."""
        return dataclasses.replace(self.clone(), **changes)
