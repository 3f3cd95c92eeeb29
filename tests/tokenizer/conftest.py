"""Tokenizer fixtures built offline with the `tokenizers` library, plus transformers' AutoTokenizer as the oracle.

Three model directories, built once per session:
- `bpe_dir`: byte-level BPE (GPT-2 / Llama-3 style) with a ChatML template exercising every jinja helper,
  a BOS-adding post-processor, and a legacy special_tokens_map.json.
- `sp_dir`: SentencePiece-style BPE (Metaspace + byte fallback, llama-2 layout), add_bos_token=True and the
  llama-2 chat template (bos_token, eos_token, raise_exception).
- `demo_dir`: ember's demo tokenizer (Qwen3-style).
Helpers are fixtures (not imports) so they work under any pytest import mode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the oracle must never reach the hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from tokenizers.trainers import BpeTrainer  # noqa: E402

from ember.tokenizer import Tokenizer as EmberTokenizer  # noqa: E402
from ember.tokenizer import build_demo_tokenizer  # noqa: E402

# Plain English with a few accents; no CJK or emoji, so those fall back to bytes.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "A tokenizer splits text into tokens; an inference engine turns tokens back into text.",
    "Hello world! How are you today? I am fine, thank you, and you?",
    "Numbers like 12345 and 2024 appear, as do symbols such as #, $, % and &.",
    "Café, naïve, résumé and façade keep their accents in this small corpus.",
    "def main():\n    print('hello')\n    return 0\n",
    "Streaming output must never split a character in the middle of its bytes.",
    "Tools are called with JSON arguments, for example {\"city\": \"Paris\", \"unit\": \"celsius\"}.",
] * 3

CHATML_TEMPLATE = """\
{%- set ns = namespace(has_system=false) -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}{%- set ns.has_system = true -%}{%- break -%}{%- endif -%}
{%- endfor -%}
{{- bos_token if add_bos_in_template is defined and add_bos_in_template else '' -}}
{%- if not ns.has_system -%}
<|im_start|>system
You are a helpful assistant{{ ' called ' + assistant_name if assistant_name is defined else '' }}.<|im_end|>
{% endif -%}
{%- if tools -%}
<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson(indent=2) }}
{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif -%}
{%- if documents -%}
<|im_start|>system
{% for doc in documents %}[{{ loop.index }}] {{ doc.title }}: {{ doc.text }}
{% endfor %}<|im_end|>
{% endif -%}
{%- for message in messages -%}
    {%- if message.role not in ['system', 'user', 'assistant', 'tool'] -%}
        {{- raise_exception('Unknown role: ' + message.role) -}}
    {%- endif -%}
    {%- if message.role == 'tool' and message.content is not string -%}{%- continue -%}{%- endif -%}
<|im_start|>{{ message.role }}
{% if message.role == 'assistant' -%}
{% generation %}{{ message.content | default('') }}
{%- if message.reasoning_content is defined %} (thought: {{ message.reasoning_content }}){% endif -%}
{%- for call in message.tool_calls | default([]) %}
<tool_call>{{ call.function | tojson }}</tool_call>
{%- endfor %}{% endgeneration %}
{%- else -%}
{{ message.content }}
{%- endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def _build_bpe(out_dir: Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=700, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    bos_id = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|endoftext|> $A", pair="<|endoftext|> $A <|endoftext|> $B",
                                      special_tokens=[("<|endoftext|>", bos_id)]),
    ])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    # No added_tokens_decoder: transformers then reads special_tokens_map.json (legacy path).
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,  # ignored by transformers 5 when tokenizer.json exists
        "bos_token": "<|endoftext|>",
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "image_token": "<|image|>",  # model-specific named token, missing from tokenizer.json
        "additional_special_tokens": ["<|im_start|>"],
        "chat_template": CHATML_TEMPLATE,
    })
    _write_json(out_dir / "special_tokens_map.json", {
        "pad_token": {"content": "<|pad|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
    })


def _train_metaspace_merges() -> tuple[list[str], list[tuple[str, str]]]:
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    base.train_from_iterator(_CORPUS, trainer=BpeTrainer(vocab_size=450, show_progress=False))
    state = json.loads(base.to_str())["model"]
    vocab = sorted(state["vocab"], key=state["vocab"].get)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    return vocab, merges


def _build_sentencepiece(out_dir: Path) -> None:
    # llama-2 layout: <unk>, <s>, </s>, then the 256 byte tokens, then the learned pieces.
    learned, merges = _train_metaspace_merges()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in learned:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"])}
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "chat_template": LLAMA2_TEMPLATE,
    })


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("bpe")
    _build_bpe(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def sp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("sentencepiece")
    _build_sentencepiece(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("demo")
    build_demo_tokenizer(out_dir)
    return out_dir


@pytest.fixture(scope="session", params=["bpe", "sp", "demo"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    """Each of the three tokenizer directories in turn."""
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="session")
def load_hf() -> Callable[[Path], object]:
    """transformers.AutoTokenizer for a directory, cached per session (loading costs ~0.1 s)."""
    from transformers import AutoTokenizer

    cache: dict[Path, object] = {}

    def load(path: Path) -> object:
        if path not in cache:
            cache[path] = AutoTokenizer.from_pretrained(str(path))
        return cache[path]

    return load


@pytest.fixture(scope="session")
def load_ember() -> Callable[[Path], EmberTokenizer]:
    """ember Tokenizer for a directory, cached per session."""
    cache: dict[Path, EmberTokenizer] = {}

    def load(path: Path) -> EmberTokenizer:
        if path not in cache:
            cache[path] = EmberTokenizer.from_dir(path)
        return cache[path]

    return load


SAMPLE_TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello  world\n\nNew paragraph\twith tab",
    "The quick brown fox jumps over the lazy dog.",
    "Café résumé naïve",
    "你好，世界",
    "emoji 😀👍🏽 and flags 🇫🇷 mixed with text",
    "numbers 3.14159 and 1,000,000",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<s>[INST] hello [/INST] answer </s>",
    "text<think>inner</think>after <tool_call>{\"a\": 1}</tool_call>",
    "<|endoftext|><|endoftext|>",
    "   leading and trailing spaces   ",
    "\u00a0non-breaking\u2009thin space and zero\u200bwidth",
    "ﬁ ligature and A\u030a (combining ring) and Ａ fullwidth",
]


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    return list(SAMPLE_TEXTS)
