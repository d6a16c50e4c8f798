"""Tool calling through a real `python -m runtime.serve.server`, asked with the official openai client.

The tiny model is random, so `auto` gives no calls (the parsers are unit-tested in
tests/runtime/test_tool_calls.py); `required` and a named choice are grammar-forced, so
the calls are always valid, end to end. Its template takes `tools` (Qwen 2.5's tool
parts), with a context long enough for them; the fallback prompt is unit-tested in
tests/runtime/test_tool_prompt.py.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest

from tests.runtime.test_tool_prompt import tools_model
from tests.runtime_server.conftest import SERVED_NAME, start_server

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
               "required": ["hour"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    celsius: bool


@pytest.fixture(scope="module")
def openai_client(model_factory, tmp_path_factory):
    model = tools_model(model_factory, tmp_path_factory.mktemp("tools-model") / "model")
    server = start_server(["--model", str(model), "--served-model-name", SERVED_NAME,
                           "--kv-cache-tokens", "2048", "--block-size", "16"], model.parent / "server.log")
    try:
        server.wait_health({"ready"})
        with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            yield client
    finally:
        server.stop()


def ask(client, **kwargs):
    return client.chat.completions.create(**{"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 120,
                                             "temperature": 0, **kwargs})


def test_a_named_call_streams_to_the_same_call_as_the_full_answer(openai_client):
    full = ask(openai_client, tools=TOOLS, tool_choice=NAMED)
    choice = full.choices[0]
    assert (choice.finish_reason, choice.message.content, len(choice.message.tool_calls)) == ("tool_calls", None, 1)
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    # the official client's own assembly of the deltas
    with openai_client.chat.completions.stream(model=SERVED_NAME, messages=MESSAGES, max_tokens=120,
                                               temperature=0, tools=TOOLS, tool_choice=NAMED) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (call.function.name, call.function.arguments)]


def test_required_makes_valid_calls_of_the_offered_tools(openai_client):
    # a random model may call again and again until max_tokens (then "length", no calls):
    # these seeds end their arrays; seed 2 calls both tools
    answers = {}
    for seed in (1, 2, 3):
        full = ask(openai_client, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed)
        calls = answers[seed] = full.choices[0].message.tool_calls
        assert calls and full.choices[0].finish_reason == "tool_calls"
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
        one = ask(openai_client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed)
        assert len(one.choices[0].message.tool_calls) == 1
    streamed = ask(openai_client, tools=TOOLS, tool_choice="required", temperature=1.0, seed=2, stream=True)
    deltas = [d for chunk in streamed if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    assert [d.index for d in deltas] == list(range(len(answers[2])))
    assert [(d.function.name, d.function.arguments) for d in deltas] == [
        (c.function.name, c.function.arguments) for c in answers[2]]


def test_typed_parse_of_a_pydantic_function_tool(openai_client):
    got = openai_client.chat.completions.parse(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=120, temperature=0.8, seed=5,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    parsed = got.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, GetWeather) and len(parsed.city) <= 8


def test_calls_and_results_round_trip_into_the_next_turn(openai_client):
    call = ask(openai_client, tools=TOOLS, tool_choice=NAMED).choices[0].message.tool_calls[0]
    turns = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]
    answer = ask(openai_client, messages=turns, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0]
    assert answer.message.tool_calls is None and isinstance(answer.message.content, str)
    assert answer.finish_reason in ("stop", "length")
    auto = ask(openai_client, messages=turns, tools=TOOLS, max_tokens=8).choices[0]   # random text: no call
    assert auto.finish_reason in ("stop", "length")


def test_a_bad_tool_choice_is_a_400_naming_it(openai_client):
    with pytest.raises(openai.BadRequestError) as info:
        ask(openai_client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.body["param"] == "tool_choice"
