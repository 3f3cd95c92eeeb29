"""Representative snippets of the Gemma 4 and Qwen3.5 chat templates, rendered by ember as transformers renders
them: Gemma's turn markers, system folding, role renaming and content parts; Qwen3.5's reasoning split, tool
declarations and XML-style tool calls with per-parameter values, found with namespaces over reversed history."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ember.tokenizer import Tokenizer

GEMMA_STYLE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] | trim + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

QWEN35_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string"
    " and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = message.reasoning_content if message.reasoning_content is string else '' %}"
    "{%- if not reasoning_content and '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- set tc = tool_call.function if tool_call.function else tool_call %}"
    "{{- '\\n<tool_call>\\n<function=' + tc.name + '>\\n' }}"
    "{%- set args = tc.arguments if tc.arguments is mapping else {} %}"
    "{%- for name, value in args.items() %}{{- '<parameter=' + name + '>\\n' }}"
    "{{- value if value is string else value | tojson }}{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather — °C",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SYSTEM = {"role": "system", "content": "  Be terse.  "}
USER = {"role": "user", "content": "Weather in Paris? 😀"}
CALL = {"role": "assistant", "content": "<think>\nneed the tool\n</think>\n\nChecking.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris", "days": [1, 2]}}}]}
RESULT = {"role": "tool", "content": "{\"temp\": 21}"}
ANSWER = {"role": "assistant", "content": "<think>\nit said 21\n</think>\n\n21 °C."}
PARTS = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]}


def _with_template(bpe_dir: Path, dst: Path, template: str) -> Path:
    shutil.copy(bpe_dir / "tokenizer.json", dst / "tokenizer.json")
    config = {"chat_template": template, "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    (dst / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return dst


@pytest.mark.parametrize("conversation", [[USER], [SYSTEM, USER, {"role": "assistant", "content": " Sunny. "}, PARTS]])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma_style_template_matches(conversation, add_generation_prompt, bpe_dir, tmp_path, load_hf) -> None:
    d = _with_template(bpe_dir, tmp_path, GEMMA_STYLE)
    tok, hf = Tokenizer.from_dir(d), load_hf(d)
    expected = hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert tok.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt) == expected
    assert "<start_of_turn>model\n" in expected or not add_generation_prompt


@pytest.mark.parametrize("enable_thinking", [None, False])
@pytest.mark.parametrize("tools", [None, [TOOL]])
def test_qwen35_style_template_matches(enable_thinking, tools, bpe_dir, tmp_path, load_hf) -> None:
    d = _with_template(bpe_dir, tmp_path, QWEN35_STYLE)
    tok, hf = Tokenizer.from_dir(d), load_hf(d)
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    for conversation in ([USER], [SYSTEM, USER, CALL, RESULT, RESULT, ANSWER], [USER, ANSWER, USER]):
        expected = hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, tools=tools,
                                          **extra)
        assert tok.apply_chat_template(conversation, tools=tools, enable_thinking=enable_thinking) == expected
    assert "<parameter=days>\n[1, 2]\n</parameter>" in tok.apply_chat_template([SYSTEM, USER, CALL, RESULT])
