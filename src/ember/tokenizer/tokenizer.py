"""Tokenizer loaded from a Hugging Face model directory, matching transformers 5's `TokenizersBackend`.

What transformers 5 does on `AutoTokenizer.from_pretrained(dir)` with a tokenizer.json (and what we mirror):
- tokenizer.json is the pipeline; `add_bos_token`/`add_eos_token` in tokenizer_config.json are dropped, so BOS/EOS
  come only from tokenizer.json's post-processor (transformers' `_from_pretrained` pops them).
- named special tokens (bos/eos/unk/sep/pad/cls/mask, any other `*_token`) and `added_tokens_decoder` entries that
  the backend lacks are added to it; named ones are forced `special=True`.
- chat_template.jinja (+ additional_chat_templates/*.jinja) replace any template in tokenizer_config.json.
- special_tokens_map.json is only read when tokenizer_config.json has no `added_tokens_decoder` (legacy path).
- padding/truncation baked into tokenizer.json are switched off for plain `tokenizer(text)` calls.
- `tokenizer_class: LlamaTokenizer` on a non-byte-level tokenizer.json gets LlamaTokenizer's rebuilt
  Metaspace pipeline (other model-specific classes are assumed to match their tokenizer.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from ember.tokenizer.chat_template import render_chat, select_template

_NAMED_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")
_CHAT_TEMPLATE_FILE = "chat_template.jinja"
_CHAT_TEMPLATE_DIR = "additional_chat_templates"


@dataclass(slots=True)
class TokenizerConfig:
    """The parts of tokenizer_config.json (and friends) that change encoding, decoding or chat rendering."""

    special_tokens: dict[str, AddedToken] = field(default_factory=dict)  # bos_token -> token, in HF order
    extra_special_tokens: list[AddedToken] = field(default_factory=list)
    added_tokens: list[AddedToken] = field(default_factory=list)  # added_tokens_decoder, sorted by id
    chat_templates: dict[str, str] = field(default_factory=dict)  # name -> jinja source ("default" first)
    clean_up_tokenization_spaces: bool = False
    clean_up_bpe_anyway: bool = False
    split_special_tokens: bool = False
    tokenizer_class: str | None = None  # e.g. "LlamaTokenizerFast"; some classes rebuild the pipeline
    legacy: bool = False  # LlamaTokenizer: prepend "▁" after special tokens too
    add_prefix_space: bool = True  # LlamaTokenizer: prepend "▁" to the text at all


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _to_added_token(value: Any, where: str) -> AddedToken | None:
    """A token given as a string or an AddedToken dict (`{"content": ..., "special": ...}`); None stays None."""
    if value is None or isinstance(value, AddedToken):
        return value
    if isinstance(value, str):
        return AddedToken(value, special=True)
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return AddedToken(**{k: v for k, v in value.items() if k in _ADDED_TOKEN_FIELDS})
    raise ValueError(f"{where} must be a string or a dict with a string 'content', got {value!r}")


def _named_special_tokens(config: dict[str, Any]) -> dict[str, AddedToken]:
    named: dict[str, AddedToken] = {}
    for key in _NAMED_SPECIAL_KEYS:
        if (token := _to_added_token(config.get(key), key)) is not None:
            named[key] = token
    # Model-specific names (image_token, ...) are named special tokens too and reach the chat template.
    for key, value in config.items():
        is_token = isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("content"), str))
        if key.endswith("_token") and key not in _NAMED_SPECIAL_KEYS and is_token:
            named[key] = _to_added_token(value, key)
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        for key, value in extra.items():
            named[key] = _to_added_token(value, f"extra_special_tokens[{key!r}]")
    return named


def _extra_special_tokens(config: dict[str, Any]) -> list[AddedToken]:
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if isinstance(extra, dict):
        return []  # a dict holds named tokens, handled by _named_special_tokens
    if not isinstance(extra, list):
        raise ValueError(f"additional_special_tokens must be a list of tokens, got {extra!r}")
    return [_to_added_token(t, "additional_special_tokens") for t in extra]


def _added_tokens(config: dict[str, Any]) -> list[AddedToken]:
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ValueError(f"added_tokens_decoder must map ids to token dicts, got {type(decoder).__name__}")
    return [_to_added_token(decoder[k], f"added_tokens_decoder[{k}]") for k in sorted(decoder, key=int)]


def _chat_templates(model_dir: Path, config: dict[str, Any]) -> dict[str, str]:
    templates: dict[str, str] = {}
    if (model_dir / _CHAT_TEMPLATE_FILE).is_file():
        templates["default"] = (model_dir / _CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    extra_dir = model_dir / _CHAT_TEMPLATE_DIR
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if templates:  # template files win over tokenizer_config.json, as in transformers
        return templates
    raw = config.get("chat_template")
    if raw is None:
        return {}
    if isinstance(raw, str):
        return {"default": raw}
    if isinstance(raw, list) and all(isinstance(t, dict) and {"name", "template"} <= t.keys() for t in raw):
        return {t["name"]: t["template"] for t in raw}
    raise ValueError(f"chat_template must be a string or a list of {{name, template}} dicts, got {raw!r:.200}")


def load_tokenizer_config(model_dir: Path) -> TokenizerConfig:
    """Read tokenizer_config.json, special_tokens_map.json and chat template files from `model_dir`."""
    config_path = model_dir / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    map_path = model_dir / "special_tokens_map.json"
    if "added_tokens_decoder" not in config and map_path.is_file():
        config = {**config, **_read_json(map_path)}  # legacy: the map overrides the config
    return TokenizerConfig(
        special_tokens=_named_special_tokens(config),
        extra_special_tokens=_extra_special_tokens(config),
        added_tokens=_added_tokens(config),
        chat_templates=_chat_templates(model_dir, config),
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        clean_up_bpe_anyway=bool(
            config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
        ),
        split_special_tokens=bool(config.get("split_special_tokens", False)),
        tokenizer_class=config.get("tokenizer_class"),
        legacy=bool(config.get("legacy", False)),
        add_prefix_space=config.get("add_prefix_space") is not False,
    )


def _apply_llama_pipeline(backend: tokenizers.Tokenizer, config: TokenizerConfig, is_byte_level: bool) -> None:
    """Rebuild the pre-tokenizer/decoder as transformers 5's LlamaTokenizer does, when AutoTokenizer picks it.

    Old llama-2 style tokenizer.json files prepend "▁" with a normalizer (so also after <s>, </s>, ...);
    LlamaTokenizer replaces that with a Metaspace pre-tokenizer, which changes ids after special tokens.
    Byte-level files declaring LlamaTokenizer (Llama 3) are loaded as plain TokenizersBackend instead.
    """
    if (config.tokenizer_class or "").removesuffix("Fast") != "LlamaTokenizer" or is_byte_level:
        return
    if not config.add_prefix_space:
        prepend_scheme = "never"
    else:
        prepend_scheme = "always" if config.legacy else "first"
    backend.normalizer = None
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme=prepend_scheme, split=False
    )
    steps = [tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(), tokenizers.decoders.Fuse()]
    if config.add_prefix_space:
        steps.append(tokenizers.decoders.Strip(content=" ", left=1))
    backend.decoder = tokenizers.decoders.Sequence(steps)


def _sync_added_tokens(backend: tokenizers.Tokenizer, config: TokenizerConfig) -> None:
    # Same order as TokenizersBackend.__init__: config added tokens, then named/extra specials the backend lacks.
    existing = {t.content for t in backend.get_added_tokens_decoder().values()}
    to_add = list(config.added_tokens)
    known = existing | {t.content for t in to_add}
    named = {t.content for t in config.special_tokens.values()}
    for token in [*config.special_tokens.values(), *config.extra_special_tokens]:
        if token.content not in known:
            to_add.append(token)
            known.add(token.content)
    for token in to_add:
        if token.content in named:
            token.special = True
    if to_add:
        backend.add_tokens(to_add)


def _clean_up_tokenization(text: str) -> str:
    # transformers' clean_up_tokenization (meant for WordPiece output).
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class Tokenizer:
    """Text <-> token ids plus chat templating for one model, equal to transformers' AutoTokenizer output."""

    def __init__(self, backend: tokenizers.Tokenizer, config: TokenizerConfig) -> None:
        self._backend = backend
        self._config = config
        _sync_added_tokens(backend, config)
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = config.split_special_tokens
        self._special_tokens_map = {k: t.content for k, t in config.special_tokens.items()}
        special = [*self._special_tokens_map.values(), *(t.content for t in config.extra_special_tokens)]
        self._all_special_ids = frozenset(i for t in special if (i := backend.token_to_id(t)) is not None)
        added = backend.get_added_tokens_decoder()
        self._decode_skip_ids = frozenset(i for i, t in added.items() if t.special)
        byte_ids = (backend.token_to_id(f"<0x{b:02X}>") for b in range(256))
        self._byte_token_ids = frozenset(i for i in byte_ids if i is not None)
        # transformers skips the WordPiece-style cleanup for BPE models unless forced.
        is_bpe = isinstance(backend.model, tokenizers.models.BPE)
        self._clean_up = config.clean_up_tokenization_spaces and (not is_bpe or config.clean_up_bpe_anyway)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json, special_tokens_map.json and chat templates from `path`."""
        model_dir = Path(path)
        if not model_dir.is_dir():
            raise FileNotFoundError(f"tokenizer directory {model_dir} does not exist or is not a directory")
        tokenizer_json = model_dir / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise FileNotFoundError(
                f"{tokenizer_json} not found: ember needs a `tokenizers` tokenizer.json in the model directory "
                "(convert sentencepiece/tiktoken files with transformers' save_pretrained first)"
            )
        serialized = tokenizer_json.read_text(encoding="utf-8")
        try:
            backend = tokenizers.Tokenizer.from_str(serialized)
        except Exception as e:  # the Rust side raises a bare Exception on malformed files
            raise ValueError(f"{tokenizer_json} could not be parsed by the tokenizers library: {e}") from e
        config = load_tokenizer_config(model_dir)
        # Same test transformers uses to route byte-level "LlamaTokenizer" repos to TokenizersBackend.
        _apply_llama_pipeline(backend, config, is_byte_level='"ByteLevel"' in serialized)
        return cls(backend, config)

    # ---- vocabulary -------------------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (used by the incremental detokenizer)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (transformers' `len(tokenizer)`)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Named special tokens, e.g. {"eos_token": "<|im_end|>"}; chat templates see these as variables."""
        return dict(self._special_tokens_map)

    def _named_id(self, key: str) -> int | None:
        token = self._special_tokens_map.get(key)
        return None if token is None else self._backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._named_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._named_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._named_id("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._named_id("unk_token")

    @property
    def all_special_ids(self) -> frozenset[int]:
        """Ids of the named and additional special tokens (transformers' `all_special_ids`)."""
        return self._all_special_ids

    @property
    def decode_skip_ids(self) -> frozenset[int]:
        """Ids that `decode(..., skip_special_tokens=True)` drops: every added token flagged special."""
        return self._decode_skip_ids

    @property
    def byte_token_ids(self) -> frozenset[int]:
        """Ids of byte-fallback tokens `<0x00>`..`<0xFF>` (empty for byte-level BPE)."""
        return self._byte_token_ids

    @property
    def chat_template(self) -> str | None:
        """The default chat template source, or None when the model ships none."""
        return self._config.chat_templates.get("default")

    @property
    def chat_templates(self) -> dict[str, str]:
        return dict(self._config.chat_templates)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        skip = self._all_special_ids if skip_special_tokens else frozenset()
        return [self._id_to_token(i) for i in ids if i not in skip]

    def _id_to_token(self, token_id: int) -> str:
        token = self._backend.id_to_token(int(token_id))
        if token is None:
            raise ValueError(f"token id {token_id} is out of range [0, {self.vocab_size})")
        return token

    # ---- text <-> ids -----------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for `text`; `add_special_tokens` applies tokenizer.json's post-processor (e.g. BOS)."""
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text for `ids`; with `skip_special_tokens` every added token flagged special is dropped."""
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up else text

    # ---- chat -------------------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        documents: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render `messages` as transformers' `apply_chat_template(..., tokenize=False)` does.

        `enable_thinking` is passed to the template only when given; `extra` keys become template variables
        and override special tokens of the same name.
        """
        template = select_template(self._config.chat_templates, has_tools=tools is not None)
        if enable_thinking is not None:
            extra["enable_thinking"] = enable_thinking
        template_vars = {**self._special_tokens_map, **extra}
        return render_chat(template, messages, tools, documents, add_generation_prompt, template_vars)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        documents: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> list[int]:
        """Prompt token ids for a chat: the rendered template encoded without adding special tokens."""
        text = self.apply_chat_template(messages, tools, add_generation_prompt, enable_thinking, documents, **extra)
        return self.encode(text, add_special_tokens=False)
