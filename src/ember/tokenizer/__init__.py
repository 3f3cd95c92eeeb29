"""Tokenization for ember: HF-compatible encode/decode, chat templates, and streaming detokenization."""

from ember.tokenizer.chat_template import ChatTemplateError
from ember.tokenizer.demo import DEMO_VOCAB_SIZE, build_demo_tokenizer
from ember.tokenizer.detokenizer import IncrementalDetokenizer
from ember.tokenizer.tokenizer import Tokenizer, TokenizerConfig

__all__ = [
    "DEMO_VOCAB_SIZE",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerConfig",
    "build_demo_tokenizer",
]
