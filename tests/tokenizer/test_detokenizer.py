"""IncrementalDetokenizer: streamed pieces concatenate to the full decode and never end mid-character."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ember.tokenizer import IncrementalDetokenizer, Tokenizer

STREAM_TEXTS = [
    "Hello world, this is a streamed answer.",
    "emoji 😀👍🏽🇫🇷 and CJK 你好世界 and accents café",
    "😀😀😀",
    "你好",
    "  two leading spaces and trailing  ",
    "line one\nline two\n\n  indented",
    "mixed<|im_end|>special<think>tags</think>😀",
]


def _stream(tok: Tokenizer, ids: list[int], skip: bool, chunk_sizes: list[int], prompt: list[int] | None = None):
    detok = IncrementalDetokenizer(tok, prompt or [], skip_special_tokens=skip)
    pieces, pos = [], 0
    for size in chunk_sizes:
        if pos >= len(ids):
            break
        pieces.append(detok.add(ids[pos:pos + size]))
        pos += size
    pieces.append(detok.add(ids[pos:]))
    pieces.append(detok.finish())
    return detok, pieces


@pytest.mark.parametrize("skip", [True, False])
def test_streamed_text_equals_decode(model_dir: Path, load_ember, skip: bool) -> None:
    tok = load_ember(model_dir)
    for text in STREAM_TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        detok, pieces = _stream(tok, ids, skip, [1] * len(ids), prompt=tok.encode("Prompt:"))
        assert "".join(pieces) == detok.text == tok.decode(ids, skip_special_tokens=skip), text
        # Every piece returned before finish() is stable: no dangling partial character.
        assert not any(p.endswith("\ufffd") for p in pieces[:-1]), pieces


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_streams_equal_decode(model_dir: Path, load_ember, skip: bool) -> None:
    tok = load_ember(model_dir)
    rng = random.Random(1234)
    special = sorted(tok.decode_skip_ids)
    byte_ids = sorted(tok.byte_token_ids) or [tok.token_to_id(c) for c in "Ġabc"]
    for _ in range(120):
        # Bias towards byte tokens and special tokens: they are where streaming goes wrong.
        pools = [list(range(tok.vocab_size)), byte_ids, special]
        ids = [rng.choice(rng.choices(pools, weights=[6, 3, 1])[0]) for _ in range(rng.randrange(1, 40))]
        chunks = [rng.randrange(1, 4) for _ in range(len(ids))]
        detok, pieces = _stream(tok, ids, skip, chunks)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip), ids


def test_multibyte_character_is_held_until_complete(bpe_dir: Path, load_ember) -> None:
    tok = load_ember(bpe_dir)
    ids = tok.encode("😀", add_special_tokens=False)
    assert len(ids) > 1  # the emoji is not in the tiny vocab, so it spans several byte tokens
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add(ids[-1:]) == "😀"


def test_byte_fallback_character_split_across_tokens(sp_dir: Path, load_ember) -> None:
    tok = load_ember(sp_dir)
    ids = tok.encode("a 你好 b", add_special_tokens=False)
    assert sum(i in tok.byte_token_ids for i in ids) == 6  # two CJK characters, three bytes each
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.add([i]) for i in ids] + [detok.finish()]
    assert "".join(pieces) == "a 你好 b"
    assert all("\ufffd" not in p for p in pieces)


def test_sentencepiece_first_token_leading_space(sp_dir: Path, load_ember) -> None:
    tok = load_ember(sp_dir)
    ids = tok.encode("Hello world", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids[:1])[0].startswith("▁")
    detok = IncrementalDetokenizer(tok, tok.encode("Say hi:"))
    first = detok.add(ids[:1])
    assert first == tok.decode(ids[:1]) and not first.startswith(" ")  # like a full decode of the output
    assert first + detok.add(ids[1:]) == "Hello world"
    # A space-only first token is kept once text follows it, exactly as the full decode keeps it.
    ids = tok.encode("  spaced", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    assert "".join(detok.add([i]) for i in ids) + detok.finish() == tok.decode(ids)


def test_trailing_partial_character_is_flushed_by_finish(bpe_dir: Path, load_ember) -> None:
    tok = load_ember(bpe_dir)
    ids = tok.encode("ok 😀", add_special_tokens=False)[:-1]  # drop the emoji's last byte
    detok = IncrementalDetokenizer(tok, [])
    streamed = detok.add(ids)
    assert not streamed.endswith("\ufffd")
    flushed = detok.finish()
    assert flushed.endswith("\ufffd")
    assert streamed + flushed == detok.text == tok.decode(ids)
    assert detok.finish() == ""


def test_skipped_special_tokens_emit_nothing(demo_dir: Path, load_ember) -> None:
    tok = load_ember(demo_dir)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    assert detok.add([tok.eos_token_id]) == ""
    keep = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert keep.add([tok.eos_token_id]) == "<|im_end|>"


def test_add_after_finish_is_an_error(demo_dir: Path, load_ember) -> None:
    detok = IncrementalDetokenizer(load_ember(demo_dir), [1, 2, 3])
    detok.finish()
    with pytest.raises(ValueError, match="after finish"):
        detok.add([5])


def test_window_stays_small(demo_dir: Path, load_ember) -> None:
    tok = load_ember(demo_dir)
    ids = tok.encode("The library was quiet except for the soft sound of pages turning. " * 20)
    detok = IncrementalDetokenizer(tok, [])
    for token_id in ids:
        detok.add([token_id])
        assert len(detok._ids) - detok._prefix_offset <= 4  # O(1) work per token
    assert detok.text == tok.decode(ids)


def test_runs_of_specials_and_padded_vocab_ids_keep_the_window_small(demo_dir: Path, load_ember) -> None:
    # models pad their vocabulary past the tokenizer's; such ids and skipped specials decode to nothing
    tok = load_ember(demo_dir)
    ids = tok.encode("Hello there") + [tok.eos_token_id] * 50 + [tok.vocab_size + 7] * 50 + tok.encode(" friend")
    detok = IncrementalDetokenizer(tok, [])
    for token_id in ids:
        detok.add([token_id])
        assert len(detok._ids) - detok._prefix_offset <= 4
    assert detok.text + detok.finish() == tok.decode(ids)
    assert len(detok.output_token_ids) == len(ids)
