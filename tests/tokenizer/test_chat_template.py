"""apply_chat_template / encode_chat against transformers' apply_chat_template, plus template-loading rules."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from ember.tokenizer import ChatTemplateError, Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city — in °C or °F",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are terse. Ünïcödé is fine."}
USER = {"role": "user", "content": "What's the weather in Paris? 😀"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,  # OpenAI style; dropped before rendering
    "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}],
}
TOOL_CALL_STR_ARGS = {
    "role": "assistant",
    "content": "Let me check.",
    "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Nice\"}"}}],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
ANSWER = {"role": "assistant", "content": "<think>\nIt is 21.\n</think>\n\nIt is 21 °C and clear."}
REASONED = {"role": "assistant", "content": "Sunny.", "reasoning": "the tool said so"}

CONVERSATIONS = {
    "single_user": [USER],
    "system_user": [SYSTEM, USER],
    "multi_turn": [SYSTEM, USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Tomorrow?"}],
    "tool_round_trip": [USER, TOOL_CALL, TOOL_RESULT, TOOL_RESULT, ANSWER],
    "string_arguments": [SYSTEM, USER, TOOL_CALL_STR_ARGS, TOOL_RESULT],
    "reasoning_alias": [USER, REASONED],
}


def _hf_render(hf, messages, **kwargs) -> str:
    return hf.apply_chat_template(messages, tokenize=False, **kwargs)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chatml_and_qwen3_templates_match(name, add_generation_prompt, bpe_dir, demo_dir, load_hf, load_ember):
    messages = CONVERSATIONS[name]
    for model_dir in (bpe_dir, demo_dir):
        hf, tok = load_hf(model_dir), load_ember(model_dir)
        for tools in (None, [WEATHER_TOOL]):
            kwargs = {"add_generation_prompt": add_generation_prompt, "tools": tools}
            expected = _hf_render(hf, messages, **kwargs)
            assert tok.apply_chat_template(messages, **kwargs) == expected
            assert tok.encode_chat(messages, **kwargs) == hf.apply_chat_template(messages, return_dict=False,
                                                                                 **kwargs)


@pytest.mark.parametrize("enable_thinking", [None, True, False])
def test_enable_thinking_matches(enable_thinking, demo_dir, load_hf, load_ember) -> None:
    hf, tok = load_hf(demo_dir), load_ember(demo_dir)
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    for messages in CONVERSATIONS.values():
        expected = _hf_render(hf, messages, add_generation_prompt=True, **kwargs)
        assert tok.apply_chat_template(messages, enable_thinking=enable_thinking) == expected
    rendered = tok.apply_chat_template([USER], enable_thinking=enable_thinking)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") == (enable_thinking is False)


def test_llama2_template_matches(sp_dir, load_hf, load_ember) -> None:
    hf, tok = load_hf(sp_dir), load_ember(sp_dir)
    conversations = [
        [USER],
        [SYSTEM, USER],
        [SYSTEM, USER, {"role": "assistant", "content": " Sunny. "}, {"role": "user", "content": "Tomorrow?"}],
    ]
    for messages in conversations:
        rendered = tok.apply_chat_template(messages)
        assert rendered == _hf_render(hf, messages, add_generation_prompt=True)
        assert rendered.startswith("<s>[INST] ")
        assert tok.encode_chat(messages) == hf.apply_chat_template(messages, add_generation_prompt=True,
                                                                   return_dict=False)
        assert tok.encode_chat(messages).count(tok.bos_token_id) == rendered.count("<s>")


def test_raise_exception_becomes_value_error(sp_dir, bpe_dir, load_ember) -> None:
    with pytest.raises(ChatTemplateError, match="must alternate"):
        load_ember(sp_dir).apply_chat_template([USER, USER])
    with pytest.raises(ValueError, match="Unknown role: robot"):
        load_ember(bpe_dir).apply_chat_template([{"role": "robot", "content": "beep"}])


def test_documents_and_extra_variables_match(bpe_dir, load_hf, load_ember) -> None:
    hf, tok = load_hf(bpe_dir), load_ember(bpe_dir)
    documents = [{"title": "Paris", "text": "Capital of France."}, {"title": "Nice", "text": "On the coast."}]
    extra = {"assistant_name": "Émber", "add_bos_in_template": True}
    expected = _hf_render(hf, [USER], add_generation_prompt=True, documents=documents, **extra)
    assert tok.apply_chat_template([USER], documents=documents, **extra) == expected
    assert expected.startswith("<|endoftext|>") and "[2] Nice: On the coast." in expected
    # A caller variable overrides the special token of the same name.
    assert tok.apply_chat_template([USER], bos_token="<BOS>", add_bos_in_template=True).startswith("<BOS>")


def test_message_objects_are_accepted(bpe_dir, load_ember) -> None:
    @dataclasses.dataclass
    class Message:
        role: str
        content: str | None

    class PydanticLike:
        def model_dump(self) -> dict:
            return {"role": "user", "content": "from pydantic", "name": None}

    tok = load_ember(bpe_dir)
    as_dicts = [{"role": "user", "content": "hi"}, {"role": "user", "content": "from pydantic"}]
    dict_render = tok.apply_chat_template(as_dicts)
    assert tok.apply_chat_template([Message("user", "hi"), PydanticLike()]) == dict_render


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "empty"),
        ("hello", "list of dicts"),
        (["hello"], r"messages\[0\] must be a dict"),
        ([{"content": "no role"}], r"messages\[0\]\['role'\] must be a string"),
        ([USER, {"role": 3, "content": "x"}], r"messages\[1\]\['role'\]"),
    ],
)
def test_bad_messages_are_value_errors(messages, match, bpe_dir, load_ember) -> None:
    with pytest.raises(ValueError, match=match):
        load_ember(bpe_dir).apply_chat_template(messages)


def test_bad_tools_and_documents_are_value_errors(bpe_dir, load_ember) -> None:
    tok = load_ember(bpe_dir)
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        tok.apply_chat_template([USER], tools=["get_weather"])
    with pytest.raises(ValueError, match=r"documents\[0\]"):
        tok.apply_chat_template([USER], documents=["just text"])


def _copy_tokenizer(src: Path, dst: Path, config: dict) -> Path:
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    (dst / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return dst


def test_no_chat_template_is_a_clear_error(bpe_dir, tmp_path) -> None:
    tok = Tokenizer.from_dir(_copy_tokenizer(bpe_dir, tmp_path, {"eos_token": "<|im_end|>"}))
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([USER])


def test_chat_template_jinja_file_wins(bpe_dir, tmp_path, load_hf) -> None:
    _copy_tokenizer(bpe_dir, tmp_path, {"chat_template": "from config: {{ messages[0].content }}"})
    (tmp_path / "chat_template.jinja").write_text("from file: {{ messages[0].content }}", encoding="utf-8")
    tok, hf = Tokenizer.from_dir(tmp_path), load_hf(tmp_path)
    assert tok.chat_template == hf.chat_template
    assert tok.apply_chat_template([USER]) == _hf_render(hf, [USER]) == f"from file: {USER['content']}"


def test_named_templates_pick_tool_use_with_tools(bpe_dir, tmp_path, load_hf) -> None:
    templates = [{"name": "default", "template": "plain {{ messages|length }}"},
                 {"name": "tool_use", "template": "tools {{ tools|length }} {{ tools[0] | tojson }}"}]
    _copy_tokenizer(bpe_dir, tmp_path, {"chat_template": templates})
    tok, hf = Tokenizer.from_dir(tmp_path), load_hf(tmp_path)
    assert tok.apply_chat_template([USER]) == _hf_render(hf, [USER]) == "plain 1"
    with_tools = tok.apply_chat_template([USER], tools=[WEATHER_TOOL])
    assert with_tools == _hf_render(hf, [USER], tools=[WEATHER_TOOL])
    assert "°C" in with_tools  # tojson keeps non-ASCII (ensure_ascii=False)


def test_jinja_helpers_match(bpe_dir, tmp_path, load_hf) -> None:
    template = (
        "{% set d = dict(a=1, b='<&>') %}{{ d | tojson }}|{{ d | tojson(indent=2, sort_keys=true) }}|"
        "{{ [1, 2] | tojson(separators=(',', ':')) }}|{{ strftime_now('%Y') }}|"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
        "{% generation %}{{ messages[-1].content }}{% endgeneration %}"
    )
    _copy_tokenizer(bpe_dir, tmp_path, {"chat_template": template})
    tok, hf = Tokenizer.from_dir(tmp_path), load_hf(tmp_path)
    assert tok.apply_chat_template([SYSTEM, USER]) == _hf_render(hf, [SYSTEM, USER])


def test_sandbox_blocks_attribute_escapes(bpe_dir, tmp_path) -> None:
    import jinja2

    _copy_tokenizer(bpe_dir, tmp_path, {"chat_template": "{% set ns = namespace() %}{% set ns.__x = 1 %}"})
    with pytest.raises(jinja2.exceptions.SecurityError):
        Tokenizer.from_dir(tmp_path).apply_chat_template([USER])
    _copy_tokenizer(bpe_dir, tmp_path, {"chat_template": "{{ messages.__class__.__mro__ }}"})
    with pytest.raises(jinja2.exceptions.SecurityError):
        Tokenizer.from_dir(tmp_path).apply_chat_template([USER])
