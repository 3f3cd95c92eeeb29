"""Chat template rendering, byte-for-byte compatible with transformers' `apply_chat_template(tokenize=False)`.

Mirrors transformers/utils/chat_template_utils.py (v5): the same sandboxed jinja environment (trim_blocks,
lstrip_blocks, loopcontrols, `{% generation %}` tag), the same `tojson` / `raise_exception` / `strftime_now`
helpers, and the same message normalisation (objects -> dicts, None-valued keys dropped, reasoning aliases).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning may come under; templates read `reasoning_content` (gpt-oss reads `thinking`).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """Raised when a chat template rejects its input via `raise_exception(...)`."""


class _GenerationTag(jinja2.ext.Extension):
    # `{% generation %}...{% endgeneration %}` marks assistant spans for training masks; rendering ignores it.
    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    # A `dict` global without attribute access to the real type, so templates can't reach its internals.
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Namespaces reject underscore names so templates can't store dunder attributes (sandbox escape route).
    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - same signature trick as jinja's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}"
            )


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Unlike jinja's built-in filter this does not HTML-escape, and exposes json.dumps options.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template rejected the input: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the same sandboxed environment transformers uses (cached by source)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def _objects_to_dicts(value: Any) -> Any:
    # Message objects (pydantic models from the server, dataclasses) become plain dicts before validation.
    if isinstance(value, Mapping):
        return {key: _objects_to_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_objects_to_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_objects_to_dicts(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _objects_to_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _objects_to_dicts(value.model_dump())
    return value


def plain_template_data(value: Any) -> Any:
    """Rebuild `value` from plain JSON types, as transformers does, so the sandbox only sees inert data."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # enum / subclass -> base type, dropping extra methods
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_template_data(k): plain_template_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_template_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_template_data(item) for item in value)
    if isinstance(value, np.generic):
        return plain_template_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_template_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_template_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _alias_reasoning(message: dict) -> dict:
    # Same key order as transformers: `thinking` first (for gpt-oss), `reasoning_content` last.
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def normalize_messages(messages: Any) -> list[dict]:
    """Validate `messages` and convert them to what the template sees (dicts, None-valued keys dropped)."""
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if len(messages) == 0:
        raise ValueError("messages is empty; a chat needs at least one message")
    normalized = []
    for i, message in enumerate(_objects_to_dicts(list(messages))):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict with a 'role' key, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}]['role'] must be a string, got {role!r}")
        # APIs send content=None / tool_calls=None; templates handle a missing key but often print "None".
        message = {key: value for key, value in message.items() if value is not None}
        normalized.append(_alias_reasoning(plain_template_data(message)))
    return normalized


def _check_tools(tools: list[dict] | None) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"tools must be a list of JSON-schema dicts, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ValueError(f"tools[{i}] must be a JSON-schema dict, got {type(tool).__name__}")
    return plain_template_data(list(tools))


def _check_documents(documents: list[dict] | None) -> list[dict] | None:
    if documents is None:
        return None
    for i, document in enumerate(documents):
        if not isinstance(document, Mapping):
            raise ValueError(f"documents[{i}] must be a dict with 'title' and 'text' keys, got {document!r}")
    return plain_template_data(list(documents))


def select_template(templates: dict[str, str], has_tools: bool) -> str:
    """Pick the template transformers would: `tool_use` when tools are given and it exists, else `default`."""
    if not templates:
        raise ValueError(
            "this tokenizer has no chat template (expected chat_template.jinja or a 'chat_template' "
            "entry in tokenizer_config.json); pass pre-tokenized prompts instead"
        )
    if has_tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ValueError(f"this tokenizer has several chat templates and none is named 'default': {sorted(templates)}")


def render_chat(
    template: str,
    messages: Any,
    tools: list[dict] | None,
    documents: list[dict] | None,
    add_generation_prompt: bool,
    template_vars: dict[str, Any],
) -> str:
    """Render `messages` with `template`; `template_vars` are special tokens plus caller extras (extras win)."""
    chat = normalize_messages(messages)
    compiled = compile_template(template)
    return compiled.render(
        messages=chat,
        tools=_check_tools(tools),
        documents=_check_documents(documents),
        add_generation_prompt=add_generation_prompt,
        **plain_template_data(template_vars),
    )
