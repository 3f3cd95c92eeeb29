"""Detokenizes new tokens, applies stop strings and shapes logprobs; one state per request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ember.engine.outputs import Logprob, PositionLogprobs, RequestDelta
from ember.request import Request
from ember.worker.model_runner import TokenLogprobs

if TYPE_CHECKING:
    from ember.tokenizer.detokenizer import IncrementalDetokenizer
    from ember.tokenizer.tokenizer import Tokenizer


@dataclass(slots=True)
class OutputState:
    detok: "IncrementalDetokenizer | None"
    stop: list[str]
    hold_back: int  # chars kept unsent while they may still begin a stop string
    text: str = ""
    num_sent_chars: int = 0
    num_sent_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    prompt_logprobs_sent: bool = False


class OutputProcessor:
    def __init__(self, tokenizer: "Tokenizer | None") -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, OutputState] = {}

    def add(self, request: Request) -> None:
        p = request.params
        detok = None
        if self.tokenizer is not None:
            from ember.tokenizer.detokenizer import IncrementalDetokenizer
            detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, p.skip_special_tokens)
        hold = max((len(s) for s in p.stop), default=1) - 1
        state = OutputState(detok, list(p.stop), hold)
        if p.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self.states[request.req_id] = state

    def remove(self, req_id: str) -> None:
        self.states.pop(req_id, None)

    def add_prompt_logprobs(self, req_id: str, rows: list[TokenLogprobs]) -> None:
        state = self.states[req_id]
        state.prompt_logprobs += [self._position(r) for r in rows]

    def _position(self, row: TokenLogprobs) -> PositionLogprobs:
        out: PositionLogprobs = {}
        for i, (tok, lp) in enumerate(zip(row.token_ids, row.logprobs)):
            if tok in out:
                continue
            rank = row.rank if i == 0 else i
            text = self.tokenizer.decode([tok], skip_special_tokens=False) if self.tokenizer else None
            out[tok] = Logprob(lp, rank, text)
        return out

    def process(self, request: Request, new_token: int | None, logprobs: TokenLogprobs | None) -> str | None:
        """Feeds the request's newest token; returns the stop string it completed, if any."""
        state = self.states[request.req_id]
        if state.detok is None or new_token is None:
            return None
        start = len(state.text)
        state.text += state.detok.add([new_token])
        if request.is_finished:
            state.text += state.detok.finish()
        if not state.stop:
            return None
        # only the new text (plus a stop string's length of context) can contain a new match
        window_start = max(0, start - state.hold_back)
        for stop in state.stop:
            idx = state.text.find(stop, window_start)
            if idx >= 0:
                keep = idx + len(stop) if request.params.include_stop_str_in_output else idx
                state.text = state.text[:keep]
                return stop
        return None

    def delta(self, request: Request, logprobs: Sequence[TokenLogprobs]) -> RequestDelta:
        """Everything not yet sent for this request."""
        state = self.states[request.req_id]
        finished = request.is_finished
        output_ids = request.output_token_ids
        new_ids = output_ids[state.num_sent_tokens:]
        state.num_sent_tokens = len(output_ids)
        new_text = self._new_text(state, finished) if state.detok is not None else ""  # no tokenizer: no text
        delta = RequestDelta(
            request.req_id, new_ids, new_text,
            [self._position(r) for r in logprobs] if request.params.logprobs is not None else None,
            finished, request.status.finish_reason if finished else None, request.stop_reason,
            len(request.prompt_token_ids), max(request.num_cached_tokens, 0),
        )
        if state.prompt_logprobs is not None and not state.prompt_logprobs_sent and new_ids:
            delta.prompt_logprobs, state.prompt_logprobs_sent = state.prompt_logprobs, True
        return delta

    @staticmethod
    def _new_text(state: OutputState, finished: bool) -> str:
        """Text not yet sent, holding back what may still begin a stop string unless the request is done."""
        end = len(state.text) if finished else max(state.num_sent_chars, len(state.text) - state.hold_back)
        new_text, state.num_sent_chars = state.text[state.num_sent_chars:end], end
        return new_text
