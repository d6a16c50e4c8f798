"""Tool calls parsed out of model text (runtime.serve.tool_calls), whole and streamed in every chunking."""
from __future__ import annotations

import pytest

from runtime.serve.tool_calls import Parsed, ToolCallParser, finish_reason, parse_tool_calls

HERMES = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\nDone.')


def calls(parsed: Parsed) -> list[tuple[int, str, str]]:
    return [(c.index, c.name, c.arguments) for c in parsed.calls]


def streamed(text: str, size: int, forced: bool = False) -> Parsed:
    parser, out = ToolCallParser(forced), Parsed()
    for at in range(0, len(text), size):
        out += parser.push(text[at:at + size])
    return out + parser.finish()


def test_hermes_blocks_become_calls_and_the_text_before_them_content():
    got = parse_tool_calls(HERMES)
    assert got.content == "Let me look." and got.message_content == "Let me look."
    assert calls(got) == [(0, "get_weather", '{"city": "Paris"}'), (1, "get_time", "{}")]
    assert len({c.id for c in got.calls}) == 2 and all(c.id.startswith("call_") for c in got.calls)


def test_only_calls_means_null_content():
    got = parse_tool_calls('\n<tool_call>{"name": "f", "arguments": {"a": [1, 2]}}</tool_call>')
    assert got.message_content is None and calls(got) == [(0, "f", '{"a": [1, 2]}')]


@pytest.mark.parametrize("text, expected", [
    ('{"name": "f", "parameters": {"x": "é"}}', [(0, "f", '{"x": "é"}')]),
    ('<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": 1}}',
     [(0, "f", "{}"), (1, "g", '{"y": 1}')]),
    ('  {"name": "f", "arguments": "{\\"x\\": 2}"}', [(0, "f", '{"x": 2}')]),
])
def test_llama3_json_answers_are_calls(text, expected):
    got = parse_tool_calls(text)
    assert calls(got) == expected and got.message_content is None


@pytest.mark.parametrize("text", [
    '{"answer": 42}', '{"name": "f", "arguments": [1]}', "Plain words, a < sign and <tool", "  ",
    '{"name": "f", "arguments": {}} and then some words',
])
def test_anything_else_is_content_unchanged(text):
    got = parse_tool_calls(text)
    assert got.calls == [] and got.content == text


def test_a_broken_block_is_given_back_as_content():
    got = parse_tool_calls('<tool_call>{"name": broken}</tool_call>')
    assert got.calls == [] and got.content == '<tool_call>{"name": broken}</tool_call>'


def test_an_unclosed_block_at_the_end_still_counts():
    assert calls(parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')) == [(0, "f", "{}")]


def test_forced_output_is_an_object_or_an_array_of_calls():
    assert calls(parse_tool_calls('{"name": "f", "arguments": {"a": 1}}', forced=True)) == [(0, "f", '{"a": 1}')]
    both = '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": true}}]'
    assert calls(parse_tool_calls(both, forced=True)) == [(0, "f", "{}"), (1, "g", '{"b": true}')]


@pytest.mark.parametrize("text, forced", [
    (HERMES, False), ("Hello  world <tool and more  ", False), ("\n\n" + HERMES[13:], False),
    ('<|python_tag|>{"name": "f", "parameters": {}}', False), ('[{"name": "f", "arguments": {}}]', True),
    ('<tool_call>{"name": broken}</tool_call> tail', False),
])
def test_every_chunking_assembles_to_the_whole_answer(text, forced):
    whole = parse_tool_calls(text, forced)
    for size in range(1, len(text) + 1):
        got = streamed(text, size, forced)
        assert (got.content, calls(got)) == (whole.content, calls(whole)), size


def test_text_that_may_start_a_call_is_held_back_until_it_cannot():
    parser = ToolCallParser()
    assert parser.push("Hi <tool_").content == "Hi"
    assert parser.push("box> ").content == " <tool_box>"
    assert parser.finish().content == " "


def test_finish_reason_is_tool_calls_only_for_a_turn_ended_with_calls():
    assert finish_reason("stop", called=True) == "tool_calls"
    assert finish_reason("length", called=True) == "length"
    assert finish_reason("stop", called=False) == "stop"
    assert finish_reason(None, called=True) is None


DEEP = "[" * 100_000


@pytest.mark.parametrize("text", [
    f"<tool_call>{DEEP}</tool_call>",                               # a block
    DEEP,                                                           # a JSON answer
    '{"name": "f", "arguments": "' + DEEP + '"}',                   # arguments as JSON text
    '{"name": "f", "arguments": ' + '{"a": ' * 300 + "1" + "}" * 300 + "}",
])
def test_output_nested_too_deep_is_content_not_a_crash(text):
    got = parse_tool_calls(text)
    assert (got.content, got.calls) == (text, [])
