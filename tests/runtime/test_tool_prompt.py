"""Tools rendered into the prompt (runtime.serve.tool_prompt): by a template that takes them, or the fallback."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime.core.tokenizer import Tokenizer
from runtime.serve.tool_prompt import encode_chat, takes_tools
from tests.support.model_factory import CHAT_TEMPLATE, build_tokenizer
from wire.requests import parse_request

# The tool parts of Qwen 2.5's template, as it ships (system prompt, calls, tool responses).
QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls is defined %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TURNS = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def tools_model(model_factory, where: Path) -> Path:
    """A tiny Llama whose template takes `tools` (Qwen's), with room for them in its
    context (2048), copied to `where`."""
    shutil.copytree(model_factory(arch="llama", max_position_embeddings=2048), where)
    config = json.loads((where / "tokenizer_config.json").read_text())
    (where / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN_TEMPLATE}))
    return where


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    build_tokenizer(512).save(str(path))
    return path


def tokenizer_with(template: str, tokenizer_json, tmp_path) -> Tokenizer:
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return Tokenizer(tmp_path)


def render(tok: Tokenizer, body: dict) -> str:
    request = parse_request("chat/completions", {"messages": TURNS, "tools": [WEATHER], **body})
    return tok.decode(encode_chat(tok, request.messages, request.tools), skip_special_tokens=False)


def test_templates_that_read_tools_are_told_apart():
    assert takes_tools(QWEN_TEMPLATE) and not takes_tools(CHAT_TEMPLATE) and not takes_tools(None)


def test_a_template_taking_tools_renders_them_and_the_round_trip(tokenizer_json, tmp_path):
    text = render(tokenizer_with(QWEN_TEMPLATE, tokenizer_json, tmp_path), {})
    assert text == (
        '<|im_start|>system\n# Tools\n<tools>\n' + json.dumps(WEATHER) + '\n</tools><|im_end|>\n'
        '<|im_start|>user\nWeather?<|im_end|>\n'
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n')


def test_tool_choice_none_leaves_the_tools_out(tokenizer_json, tmp_path):
    text = render(tokenizer_with(QWEN_TEMPLATE, tokenizer_json, tmp_path), {"tool_choice": "none"})
    assert "<tools>" not in text and '"arguments": {"city": "Paris"}' in text


def test_a_template_without_tools_gets_them_in_a_system_prompt(tokenizer_json, tmp_path):
    text = render(tokenizer_with(CHAT_TEMPLATE, tokenizer_json, tmp_path), {})
    system, user, assistant, tool = text.split("<|im_end|>\n")[:4]
    assert system.startswith("<|im_start|>system\n# Tools") and json.dumps(WEATHER) in system
    assert "<tool_call></tool_call> XML tags" in system
    assert user == "<|im_start|>user\nWeather?"
    assert assistant == ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
                         '{"city": "Paris"}}\n</tool_call>')
    assert tool == "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"


def test_the_fallback_joins_an_existing_system_message(tokenizer_json, tmp_path):
    tok = tokenizer_with(CHAT_TEMPLATE, tokenizer_json, tmp_path)
    text = render(tok, {"messages": [{"role": "system", "content": "Be brief."}, *TURNS]})
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and text.count("<|im_start|>system") == 1
