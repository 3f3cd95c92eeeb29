"""Streaming detokenization: turn generated token ids into text as they arrive, one stable piece at a time.

Follows vLLM's `detokenize_incrementally` (prefix_offset / read_offset): decode a short window of ids twice,
once without and once with the new tokens, and emit the difference. The window restarts at every emission, so
each token costs O(window), not O(output length).

The windows cover output ids only, so the pieces concatenate to exactly `tokenizer.decode(output_ids)`;
in particular a SentencePiece tokenizer drops the first output token's leading space, as a full decode does.
"""

from __future__ import annotations

from ember.tokenizer.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"  # what decoders emit for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Text for one request's output ids, emitted as soon as it can no longer change."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self._backend = tokenizer.backend
        self._skip_ids = tokenizer.decode_skip_ids if skip_special_tokens else frozenset()
        self._byte_ids = tokenizer.byte_token_ids
        self.skip_special_tokens = skip_special_tokens
        self.num_prompt_tokens = len(prompt_token_ids)
        self.output_token_ids: list[int] = []
        # ids that can produce text: skipped specials and ids past the vocabulary (models pad their
        # embedding tables) decode to nothing, and keeping them would grow the window without bound
        self._ids: list[int] = []
        self._vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        self._prefix_offset = 0  # window start: first token of the last emitted chunk
        self._read_offset = 0  # tokens before this are already emitted
        self._pieces: list[str] = []
        self._is_finished = False

    @property
    def text(self) -> str:
        """All text emitted so far (held-back bytes not included until they complete or `finish()`)."""
        return "".join(self._pieces)

    def add(self, new_token_ids: list[int]) -> str:
        """Append generated ids; return the newly stable text (possibly empty)."""
        if self._is_finished:
            raise ValueError("IncrementalDetokenizer.add() called after finish(); create a new one per request")
        new_text = []
        for token_id in new_token_ids:
            self.output_token_ids.append(token_id)
            if token_id in self._skip_ids or not 0 <= token_id < self._vocab_size:
                continue
            self._ids.append(token_id)
            new_text.append(self._step())
        piece = "".join(new_text)
        if piece:
            self._pieces.append(piece)
        return piece

    def finish(self) -> str:
        """Flush text held back at the end (e.g. a trailing partial UTF-8 sequence decodes as U+FFFD)."""
        if self._is_finished:
            return ""
        self._is_finished = True
        prefix_text, full_text = self._decode_window()
        piece = full_text[len(prefix_text):] if len(full_text) > len(prefix_text) else ""
        if piece:
            self._pieces.append(piece)
        return piece

    def _decode_window(self) -> tuple[str, str]:
        window = self._ids[self._prefix_offset:]
        num_emitted = self._read_offset - self._prefix_offset
        skip = self.skip_special_tokens
        prefix_text = self._backend.decode(window[:num_emitted], skip_special_tokens=skip) if num_emitted else ""
        return prefix_text, self._backend.decode(window, skip_special_tokens=skip)

    def _step(self) -> str:
        if self._ends_in_byte_token():
            return ""
        prefix_text, new_text = self._decode_window()
        # Nothing new (a skipped special token), or a multi-byte character still missing bytes.
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]

    def _ends_in_byte_token(self) -> bool:
        # ByteFallback decodes a whole run of <0xNN> tokens at once and turns *every* byte of an invalid run
        # into U+FFFD, so a run's text is final only once a non-byte token (that decode keeps) ends it.
        if not self._byte_ids:
            return False
        return bool(self._ids) and len(self._ids) > self._read_offset and self._ids[-1] in self._byte_ids
