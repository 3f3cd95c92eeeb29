"""Engine logprobs (one {token_id: Logprob} per position, the chosen token first) in OpenAI's two shapes:
chat's list of {token, logprob, bytes, top_logprobs} and completions' parallel lists with text offsets."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ember.engine.outputs import Logprob, PositionLogprobs
from ember.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

_FLOOR = -9999.0  # -inf is not valid JSON; OpenAI and vLLM clamp to this


def token_text(token_id: int, logprob: Logprob) -> str:
    # without a tokenizer the engine has no text for a token; vLLM names it like this
    return logprob.decoded_token if logprob.decoded_token is not None else f"token_id:{token_id}"


def _clamp(value: float) -> float:
    return max(value, _FLOOR)


def _top(position: PositionLogprobs, k: int) -> list[tuple[int, Logprob]]:
    """The k most likely tokens of a position; the chosen one is among them only if its rank is <= k."""
    return sorted(position.items(), key=lambda item: item[1].rank or 0)[:k]


def chat_logprobs(positions: list[PositionLogprobs], top_k: int) -> ChatLogprobs:
    content = []
    for position in positions:
        token_id, chosen = next(iter(position.items()))
        text = token_text(token_id, chosen)
        tops = [TopLogprob(token=token_text(t, lp), logprob=_clamp(lp.logprob),
                           bytes=list(token_text(t, lp).encode()))
                for t, lp in _top(position, top_k)]
        content.append(ChatTokenLogprob(token=text, logprob=_clamp(chosen.logprob), bytes=list(text.encode()),
                                        top_logprobs=tops))
    return ChatLogprobs(content=content)


@dataclass(slots=True)
class CompletionLogprobsBuilder:
    """Accumulates completions-style logprobs of one choice; text_offset runs on across stream chunks."""

    offset: int = 0

    def prompt(self, prompt_ids: list[int], positions: list[PositionLogprobs | None] | None,
               decode: Callable[[int], str]) -> CompletionLogprobs:
        """The echoed prompt: the first token has no logprob (nothing precedes it)."""
        out = CompletionLogprobs()
        for i, token_id in enumerate(prompt_ids):
            position = positions[i] if positions is not None and i < len(positions) else None
            if position is None:
                self._append(out, decode(token_id), None, None)
                continue
            chosen = position.get(token_id) or next(iter(position.values()))
            self._append(out, token_text(token_id, chosen), _clamp(chosen.logprob), _top_dict(position))
        return out

    def output(self, token_ids: list[int], positions: list[PositionLogprobs]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for token_id, position in zip(token_ids, positions):
            chosen = position.get(token_id) or next(iter(position.values()))
            self._append(out, token_text(token_id, chosen), _clamp(chosen.logprob), _top_dict(position))
        return out

    def _append(self, out: CompletionLogprobs, token: str, logprob: float | None, top: dict | None) -> None:
        out.tokens.append(token)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(self.offset)
        self.offset += len(token)


def _top_dict(position: PositionLogprobs) -> dict[str, float]:
    # OpenAI: the requested top tokens plus the sampled one, so up to logprobs + 1 entries
    return {token_text(t, lp): _clamp(lp.logprob) for t, lp in position.items()}


def merge(parts: list[CompletionLogprobs]) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for part in parts:
        out.tokens += part.tokens
        out.token_logprobs += part.token_logprobs
        out.top_logprobs += part.top_logprobs
        out.text_offset += part.text_offset
    return out
