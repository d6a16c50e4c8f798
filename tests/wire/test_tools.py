"""tools, tool_choice and tool messages (wire.tools through wire.requests), with no server or model."""
from __future__ import annotations

import json

import pytest

from wire.errors import ProtocolError
from wire.requests import parse_request
from wire.tools import ToolCall

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
USER = {"role": "user", "content": "Weather in Paris?"}


def parse(body: dict):
    return parse_request("chat/completions", {"messages": [USER], **body})


def refusal(body: dict) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


def grammar_schema(request) -> dict:
    return json.loads(request.params.structured_output.grammar)["grammars"][0]["json_schema"]


def test_tools_default_to_auto_with_no_grammar():
    got = parse({"tools": [WEATHER, TIME]})
    assert (got.tools.choice, got.tools.offered, got.tools.forced) == ("auto", True, False)
    assert [f.name for f in got.tools.functions] == ["get_weather", "get_time"]
    assert got.tools.functions[1].parameters == {"type": "object", "properties": {}}
    assert got.params.structured_output is None
    assert parse({}).tools is None and parse({"tool_choice": "none"}).tools is None


def test_none_keeps_the_tools_but_offers_none():
    got = parse({"tools": [WEATHER], "tool_choice": "none"})
    assert not got.tools.offered and got.params.structured_output is None


def test_a_named_choice_forces_that_functions_name_and_arguments():
    got = parse({"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert (got.tools.choice, got.tools.named, got.params.structured_output.field) == (
        "function", "get_weather", "tool_choice")
    schema = grammar_schema(got)
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == WEATHER["function"]["parameters"]


def test_required_forces_a_non_empty_array_of_any_tools_calls():
    schema = grammar_schema(parse({"tools": [WEATHER, TIME], "tool_choice": "required"}))
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    assert [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
    single = grammar_schema(parse({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}))
    assert single["maxItems"] == 1


def test_assistant_calls_and_tool_results_are_kept_for_the_template():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    got = parse({"tools": [WEATHER], "messages": [
        USER, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    assistant, tool = got.messages[1:]
    assert assistant == {"role": "assistant", "content": "",
                         "tool_calls": [{"id": "call_1", "type": "function",
                                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


def test_a_tool_call_is_sent_whole_in_a_message_and_in_a_delta():
    call = ToolCall(index=1, id="call_x", name="f", arguments="{}")
    assert call.as_message() == {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert call.as_delta() == {"index": 1, **call.as_message()}


@pytest.mark.parametrize("body, param, words", [
    ({"tools": []}, "tools", "tools: must be a non-empty list"),
    ({"tools": {"type": "function"}}, "tools", "tools: must be a non-empty list"),
    ({"tools": [{"type": "code"}]}, "tools", 'tools[0]: must be an object with type "function"'),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0].function: must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "tools[1].function.name: duplicate name 'get_weather'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]}, "tools",
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]}, "tools", "description"),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools are given"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "must be none, auto, required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "no tool named 'nope'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "must be none, auto"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined with response_format"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a boolean"),
    ({"messages": [{"role": "assistant", "tool_calls": {}}]}, "messages", "messages[0].tool_calls: must be a list"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]}, "messages",
     "messages[0].tool_calls[0]: must be"),
    ({"messages": [{"role": "tool", "content": "sunny"}]}, "messages", "messages[0].tool_call_id: must be a string"),
])
def test_a_bad_shape_is_a_400_naming_the_field(body, param, words):
    err = refusal(body)
    assert err.param == param and words in err.message


def test_a_parameters_keyword_the_grammar_lacks_is_refused_when_forced():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "array", "uniqueItems": True}}}
    assert parse({"tools": [tool]}).tools.choice == "auto"   # not enforced: fine
    err = refusal({"tools": [tool], "tool_choice": "required"})
    assert err.param == "tool_choice" and "uniqueItems" in err.message


@pytest.mark.parametrize("arguments", ["[" * 100_000, '{"a": ' * 300 + "1" + "}" * 300])
def test_a_sent_back_call_whose_arguments_nest_too_deep_is_a_400(arguments):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    err = refusal({"tools": [WEATHER], "messages": [USER, {"role": "assistant", "tool_calls": [call]}]})
    assert (err.param, err.code) == ("messages", "too_deep")
    assert err.message.startswith("messages[1].tool_calls[0].function.arguments: JSON nested deeper")


def test_a_sent_back_call_whose_arguments_are_not_json_stays_text():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}
    got = parse({"tools": [WEATHER], "messages": [USER, {"role": "assistant", "tool_calls": [call]}]})
    assert got.messages[1]["tool_calls"][0]["function"]["arguments"] == "{oops"
