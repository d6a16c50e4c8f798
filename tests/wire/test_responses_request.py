"""wire.responses_request: a Responses request becomes the chat completion that serves it,
and every bad shape is refused naming the Responses API's field."""
import pytest

from wire.errors import ProtocolError
from wire.requests import parse_chat_request
from wire.responses_request import parse_responses_request, renamed

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_string_input_is_one_user_message_after_the_instructions():
    request = parse_responses_request({"model": "m", "input": "Hi", "instructions": "Be brief",
                                       "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9})
    assert request.chat_body() == {
        "model": "m", "stream": False, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        "messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]}
    assert request.store and request.previous_response_id is None


def test_earlier_turns_come_between_the_instructions_and_the_input():
    request = parse_responses_request({"model": "m", "input": "again", "instructions": "I"})
    history = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}]
    assert [m["content"] for m in request.chat_body(history)["messages"]] == ["I", "first", "one", "again"]


def test_items_become_messages_with_tool_calls_and_tool_results():
    request = parse_responses_request({"model": "m", "input": [
        {"role": "developer", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\": \"P\"}"},
        {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny"}]}]})
    messages = request.chat_body()["messages"]
    assert messages[0] == {"role": "developer", "content": "ab"}
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert messages[4] == {"role": "assistant", "content": "It is sunny"}
    parse_chat_request(request.chat_body())          # the chat rules take it as it is


def test_function_tools_named_choice_and_json_schema_take_chat_shapes():
    request = parse_responses_request({
        "model": "m", "input": "x", "tools": [{"type": "function", "name": "get", "parameters": WEATHER}],
        "tool_choice": {"type": "function", "name": "get"}, "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}}})
    chat = request.chat_body()
    assert chat["tools"] == [{"type": "function", "function": {"name": "get", "parameters": WEATHER}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "w", "schema": WEATHER, "strict": True}}
    assert request.echo["tool_choice"] == {"type": "function", "name": "get"}
    assert request.echo["parallel_tool_calls"] is False


def test_text_and_json_object_formats():
    assert "response_format" not in parse_responses_request(
        {"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).chat_body()
    assert parse_responses_request({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
                                   ).chat_body()["response_format"] == {"type": "json_object"}


def test_the_echo_fills_openai_defaults():
    echo = parse_responses_request({"model": "m", "input": "x", "metadata": {"k": "v"}, "store": False}).echo
    assert echo["tool_choice"] == "auto" and echo["tools"] == [] and echo["parallel_tool_calls"] is True
    assert echo["text"] == {"format": {"type": "text"}} and echo["metadata"] == {"k": "v"}
    assert echo["store"] is False


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x"}, "model", "model"),
    ({"model": "m"}, "input", "input: must be"),
    ({"model": "m", "input": ""}, "input", "input"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input", "input[0].role"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input", "input[0].content[0]"),
    ({"model": "m", "input": [{"type": "reasoning"}]}, "input", "input[0].type"),
    ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input",
     "input[0].call_id"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools", "tools[0].type"),
    ({"model": "m", "input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice", "tool_choice"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "text.format.type"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format",
     "text.format.name"),
    ({"model": "m", "input": "x", "metadata": {"k": 1}}, "metadata", "metadata"),
    ({"model": "m", "input": "x", "store": "yes"}, "store", "store: must be a boolean"),
    ({"model": "m", "input": "x", "previous_response_id": 5}, "previous_response_id", "previous_response_id"),
    ({"model": "m", "input": "x", "truncation": "auto"}, "truncation", "truncation"),
    ({"model": "m", "input": "x", "background": True}, "background", "background: unknown field"),
])
def test_bad_input_is_refused_naming_the_field(body, param, words):
    with pytest.raises(ProtocolError) as refused:
        parse_responses_request(body)
    assert refused.value.param == param and words in refused.value.message


def test_what_the_chat_rules_refuse_is_named_as_the_client_named_it():
    chat = parse_responses_request({"model": "m", "input": "x", "text": {"format": {
        "type": "json_schema", "name": "w", "schema": {"type": "nonsense"}}}}).chat_body()
    with pytest.raises(ProtocolError) as refused:
        parse_chat_request(chat)
    mapped = renamed(refused.value)
    assert mapped.param == "text.format" and mapped.message.startswith("text.format.schema")
    assert renamed(ProtocolError("max_completion_tokens: too many", param="max_completion_tokens")).param \
        == "max_output_tokens"
