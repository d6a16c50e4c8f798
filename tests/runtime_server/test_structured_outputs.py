"""Structured outputs through a real `python -m runtime.serve.server`, asked with the official openai client."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from tests.runtime_server.conftest import SERVED_NAME

MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8},
    "population": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
    "districts": {"type": "array", "items": {"enum": ["north", "south", "old town"]}, "maxItems": 2}},
    "required": ["city", "population", "districts"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=6)
    legs: int = pydantic.Field(ge=0, le=8)
    vaccinated: bool


def test_json_schema_streamed_deltas_assemble_to_the_full_answer(openai_client):
    full = openai_client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, response_format=JSON_SCHEMA,
                                                 max_tokens=200, temperature=0)
    content = full.choices[0].message.content
    jsonschema.validate(json.loads(content), SCHEMA)
    assert full.choices[0].finish_reason == "stop"
    chunks = list(openai_client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES,
                                                        response_format=JSON_SCHEMA, max_tokens=200,
                                                        temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content


def test_typed_parse_with_a_pydantic_model(openai_client):
    got = openai_client.chat.completions.parse(model=SERVED_NAME, messages=MESSAGES, response_format=Pet,
                                               max_tokens=200, temperature=0.8, seed=7)
    pet = got.choices[0].message.parsed
    assert isinstance(pet, Pet) and len(pet.name) <= 6 and 0 <= pet.legs <= 8


def test_completions_with_vllm_guided_choice_and_regex(openai_client):
    choice = openai_client.completions.create(model=SERVED_NAME, prompt="Is it raining?", max_tokens=8,
                                              temperature=1.0, seed=3,
                                              extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].text in {"yes", "no"}
    regex = openai_client.completions.create(model=SERVED_NAME, prompt="A date:", max_tokens=16, temperature=0,
                                             extra_body={"guided_regex": r"20[0-9]{2}-0[1-9]-[12][0-9]"})
    assert re.fullmatch(r"20[0-9]{2}-0[1-9]-[12][0-9]", regex.choices[0].text)


def test_an_unsupported_schema_feature_is_a_400_naming_it(openai_client):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(
            model=SERVED_NAME, messages=MESSAGES, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "ids", "schema": schema}})
    assert info.value.body["param"] == "response_format"
    assert "uniqueItems" in info.value.body["message"]
