"""What the engine hands back: per-step deltas (streaming) and accumulated results (vLLM's output classes)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]  # token id -> logprob, chosen token first


@dataclass(slots=True)
class RequestDelta:
    """What one step added to one request."""

    req_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[PositionLogprobs] | None
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # once, with the first token


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        if self.logprobs is None:
            return None
        return sum(lp[t].logprob for lp, t in zip(self.logprobs, self.token_ids))

    def apply(self, delta: RequestDelta) -> None:
        self.text += delta.new_text
        self.token_ids += delta.new_token_ids
        if delta.new_logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.new_logprobs
        if delta.finished:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    finished: bool = False
