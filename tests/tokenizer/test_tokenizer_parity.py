"""ember.tokenizer.Tokenizer against transformers.AutoTokenizer: loading, special tokens, encode, decode."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from ember.tokenizer import Tokenizer


def test_vocab_and_special_ids_match(model_dir: Path, load_hf, load_ember) -> None:
    hf, tok = load_hf(model_dir), load_ember(model_dir)
    assert tok.vocab_size == len(hf)
    assert tok.bos_token_id == hf.bos_token_id
    assert tok.eos_token_id == hf.eos_token_id
    assert tok.pad_token_id == hf.pad_token_id
    assert tok.unk_token_id == hf.unk_token_id
    assert tok.all_special_ids == set(hf.all_special_ids)
    assert tok.special_tokens_map == hf.special_tokens_map
    assert tok.chat_template == hf.chat_template


def test_encode_matches(model_dir: Path, load_hf, load_ember, sample_texts: list[str]) -> None:
    hf, tok = load_hf(model_dir), load_ember(model_dir)
    for text in sample_texts:
        assert tok.encode(text) == hf(text)["input_ids"], text
        assert tok.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"], text


def test_decode_matches(model_dir: Path, load_hf, load_ember, sample_texts: list[str]) -> None:
    hf, tok = load_hf(model_dir), load_ember(model_dir)
    for text in sample_texts:
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text


def test_decode_random_ids_matches(model_dir: Path, load_hf, load_ember) -> None:
    hf, tok = load_hf(model_dir), load_ember(model_dir)
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 30))]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_convert_ids_to_tokens_and_token_to_id(model_dir: Path, load_hf, load_ember) -> None:
    hf, tok = load_hf(model_dir), load_ember(model_dir)
    ids = hf("Hello world <|im_end|> 😀")["input_ids"] + sorted(tok.all_special_ids)
    for skip in (True, False):
        assert tok.convert_ids_to_tokens(ids, skip_special_tokens=skip) == hf.convert_ids_to_tokens(
            ids, skip_special_tokens=skip)
    for token in tok.convert_ids_to_tokens(ids):
        assert tok.token_to_id(token) == hf.convert_tokens_to_ids(token)
    assert tok.token_to_id("definitely-not-a-token-\u2603\u2603") is None


def test_sentencepiece_adds_bos_from_post_processor(sp_dir: Path, load_ember) -> None:
    tok = load_ember(sp_dir)
    ids = tok.encode("Hello world")
    assert ids[0] == tok.bos_token_id == 1
    assert tok.encode("Hello world", add_special_tokens=False) == ids[1:]
    assert len(tok.byte_token_ids) == 256


def test_add_bos_token_in_config_is_ignored_like_transformers(sp_dir: Path, tmp_path: Path, load_hf) -> None:
    # transformers 5 drops add_bos_token when tokenizer.json exists: BOS comes only from its post-processor.
    state = json.loads((sp_dir / "tokenizer.json").read_text(encoding="utf-8"))
    state["post_processor"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    shutil.copy(sp_dir / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    hf, tok = load_hf(tmp_path), Tokenizer.from_dir(tmp_path)
    assert tok.encode("Hello world") == hf("Hello world")["input_ids"]
    assert tok.bos_token_id not in tok.encode("Hello world")


def test_missing_named_tokens_are_added_like_transformers(bpe_dir: Path, load_hf, load_ember) -> None:
    # <|image|> (config only) and <|pad|> (special_tokens_map.json only) are not in tokenizer.json.
    hf, tok = load_hf(bpe_dir), load_ember(bpe_dir)
    for token in ("<|image|>", "<|pad|>"):
        assert tok.token_to_id(token) == hf.convert_tokens_to_ids(token) is not None
    assert tok.special_tokens_map["image_token"] == "<|image|>"
    assert tok.pad_token_id == tok.token_to_id("<|pad|>")
    text = "a<|image|>b<|pad|>c"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert tok.decode(tok.encode(text)) == hf.decode(hf(text)["input_ids"], skip_special_tokens=True)


def test_non_special_added_tokens_survive_skip(demo_dir: Path, load_ember) -> None:
    tok = load_ember(demo_dir)
    ids = tok.encode("<|im_start|><think>x</think><|im_end|>")
    assert tok.decode(ids) == "<think>x</think>"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|><think>x</think><|im_end|>"


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        Tokenizer.from_dir(tmp_path / "nope")


def test_bad_files_are_clear_errors(bpe_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="could not be parsed"):
        Tokenizer.from_dir(tmp_path)
    shutil.copy(bpe_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": 5}), encoding="utf-8")
    with pytest.raises(ValueError, match="eos_token"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 7}), encoding="utf-8")
    with pytest.raises(ValueError, match="chat_template"):
        Tokenizer.from_dir(tmp_path)


def test_encode_rejects_non_string(bpe_dir: Path, load_ember) -> None:
    with pytest.raises(ValueError, match="str"):
        load_ember(bpe_dir).encode(["a", "b"])  # type: ignore[arg-type]


def test_decode_rejects_out_of_range_token(bpe_dir: Path, load_ember) -> None:
    tok = load_ember(bpe_dir)
    with pytest.raises(ValueError, match="out of range"):
        tok.convert_ids_to_tokens([tok.vocab_size + 10])


@pytest.mark.parametrize("overrides", [{}, {"legacy": True}, {"legacy": False}, {"add_prefix_space": False},
                                       {"tokenizer_class": "PreTrainedTokenizerFast"}])
def test_legacy_llama_tokenizer_json_matches(overrides: dict, sp_dir: Path, tmp_path: Path, load_hf,
                                             sample_texts: list[str]) -> None:
    # Old llama-2 files prepend "▁" with a normalizer; transformers' LlamaTokenizer swaps in Metaspace.
    state = json.loads((sp_dir / "tokenizer.json").read_text(encoding="utf-8"))
    state["pre_tokenizer"] = None
    state["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    config = json.loads((sp_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **overrides}), encoding="utf-8")
    hf, tok = load_hf(tmp_path), Tokenizer.from_dir(tmp_path)
    for text in [*sample_texts, "<s>[INST] hi [/INST] yo </s> next", " lead"]:
        ids = hf(text)["input_ids"]
        assert tok.encode(text) == ids, text
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False), text
