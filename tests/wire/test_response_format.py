"""response_format and guided_* (wire.response_format), parsed and checked with no server or model."""
from __future__ import annotations

import json

import pytest

from wire.errors import ProtocolError
from wire.requests import parse_request


def parse(body: dict, endpoint: str = "chat/completions"):
    base = {"messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat/completions" else {"prompt": "x"}
    return parse_request(endpoint, {**base, **body}).params.structured_output


def refusal(body: dict, endpoint: str = "chat/completions") -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse(body, endpoint)
    assert info.value.status == 400
    return info.value


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer", "minimum": 1}},
          "required": ["city"]}


def test_json_schema_becomes_a_grammar_holding_the_schema():
    got = parse({"response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}})
    assert got is not None and got.field == "response_format"
    grammar = json.loads(got.grammar)["grammars"][0]
    assert {k: v for k, v in grammar["json_schema"].items() if k != "x-guidance"} == SCHEMA


def test_text_and_no_format_mean_no_constraint():
    assert parse({"response_format": {"type": "text"}}) is None
    assert parse({}) is None


def test_json_object_is_any_object():
    got = parse({"response_format": {"type": "json_object"}}, "completions")
    assert json.loads(got.grammar)["grammars"][0]["json_schema"]["type"] == "object"


def test_vllm_guided_fields_each_make_a_grammar():
    assert parse({"guided_json": json.dumps(SCHEMA)}).field == "guided_json"
    assert '"a\\"b"' in parse({"guided_choice": ['a"b', "c"]}).grammar
    assert parse({"guided_regex": "[0-9]+"}).field == "guided_regex"
    assert parse({"guided_grammar": 'start: "x"+'}).field == "guided_grammar"
    gbnf = parse({"guided_grammar": 'root ::= "on" | "off"'})
    assert '"on"' in gbnf.grammar and "::=" not in gbnf.grammar


@pytest.mark.parametrize("keyword, schema", [
    ("uniqueItems", {"type": "array", "uniqueItems": True}),
    ("not", {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}),
    ("if", {"if": {"type": "string"}, "then": {"minLength": 1}}),
])
def test_an_unsupported_schema_feature_is_a_400_naming_it(keyword, schema):
    err = refusal({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    assert err.param == "response_format"
    assert f'"{keyword}"' in err.message


def test_a_malformed_schema_is_a_400_saying_where():
    err = refusal({"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"type": 5}}}}}})
    assert err.message.startswith('response_format.json_schema.schema["properties"]["a"]["type"]: invalid JSON schema')
    err = refusal({"guided_json": "{not json"})
    assert err.param == "guided_json" and err.message.startswith("guided_json: invalid JSON (")


DEEP_TEXT = [
    "[" * 100_000,                                   # past json's own recursion limit
    '{"type": "object", "properties": {"a": ' * 300 + "{}" + "}}" * 300,   # within it
]


@pytest.mark.parametrize("text", DEEP_TEXT, ids=["brackets", "schema"])
@pytest.mark.parametrize("body, where", [
    (lambda t: {"guided_json": t}, "guided_json"),
    (lambda t: {"response_format": {"type": "json_schema", "json_schema": {"schema": t}}},
     "response_format.json_schema.schema"),
])
def test_a_schema_given_as_json_text_nested_too_deep_is_a_400(text, body, where):
    err = refusal(body(text))
    assert (err.param, err.code) == (where.split(".")[0], "too_deep")
    assert err.message == f"{where}: JSON nested deeper than 64 levels"


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "xml"}}, "response_format", "must be one of text, json_object, json_schema"),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema: must be an object"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_regex": "(a|b"}, "guided_regex", "unclosed group"),
    ({"guided_regex": "(?=a)b"}, "guided_regex", "look-around"),
    ({"guided_grammar": "start: nowhere"}, "guided_grammar", 'unknown name: "nowhere"'),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex", "only one of guided_choice and guided_regex"),
])
def test_bad_formats_are_refused_by_name(body, param, words):
    err = refusal(body, "completions")
    assert err.param == param
    assert words in err.message
