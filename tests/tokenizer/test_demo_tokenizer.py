"""The offline demo tokenizer: size, determinism, Qwen3-style tokens, and loadable by transformers."""

from __future__ import annotations

import json
from pathlib import Path

from ember.tokenizer import DEMO_VOCAB_SIZE, Tokenizer, build_demo_tokenizer


def test_vocab_size_and_special_tokens(demo_dir: Path, load_hf, load_ember) -> None:
    tok = load_ember(demo_dir)
    assert tok.vocab_size == DEMO_VOCAB_SIZE == len(load_hf(demo_dir))
    assert tok.eos_token_id == tok.token_to_id("<|im_end|>")
    assert tok.pad_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.bos_token_id is None
    for token in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert tok.encode(token, add_special_tokens=False) == [tok.token_to_id(token)], token
    # Only ChatML control tokens are special (skipped on decode); thinking/tool tags stay visible, as in Qwen3.
    assert {tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")} == tok.decode_skip_ids


def test_build_is_deterministic(demo_dir: Path, tmp_path: Path) -> None:
    build_demo_tokenizer(tmp_path / "again")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (demo_dir / name).read_bytes(), name
    assert sorted(p.name for p in demo_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_english_compresses(demo_dir: Path, load_ember) -> None:
    tok = load_ember(demo_dir)
    text = "The weather today will be cloudy in the morning with a chance of light rain."
    ids = tok.encode(text)
    assert len(ids) < len(text) / 3
    assert tok.decode(ids) == text


def test_qwen3_generation_prompt(demo_dir: Path, load_ember) -> None:
    tok = load_ember(demo_dir)
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    no_think = tok.apply_chat_template(messages, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_config_is_qwen3_shaped(demo_dir: Path) -> None:
    config = json.loads((demo_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    tok = Tokenizer.from_dir(demo_dir)
    for token_id, entry in config["added_tokens_decoder"].items():
        assert tok.token_to_id(entry["content"]) == int(token_id)
