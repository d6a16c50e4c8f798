"""JSON a user sent (wire.json_input): parsed, or refused with a 400, never a RecursionError."""
from __future__ import annotations

import pytest

from wire.errors import ProtocolError
from wire.json_input import MAX_JSON_DEPTH, TooDeep, json_depth, loads, parse_json


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_up_to_the_limit_parses():
    assert json_depth(loads(nested(MAX_JSON_DEPTH))) == MAX_JSON_DEPTH
    assert loads(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}


@pytest.mark.parametrize("text", [nested(MAX_JSON_DEPTH + 1), "[" * 100_000, b"[" * 100_000,
                                  '{"a": ' * 500 + "1" + "}" * 500])
def test_deeper_is_too_deep_whether_or_not_json_itself_would_recurse_that_far(text):
    with pytest.raises(TooDeep):
        loads(text)
    with pytest.raises(ProtocolError) as info:
        parse_json(text, "guided_json", param="guided_json")
    err = info.value
    assert (err.status, err.code, err.param) == (400, "too_deep", "guided_json")
    assert err.message == f"guided_json: JSON nested deeper than {MAX_JSON_DEPTH} levels"


@pytest.mark.parametrize("text, words", [("{nope", "invalid JSON (Expecting property name"),
                                         (b"\xff\xfe\x00", "invalid JSON")])
def test_not_json_is_a_400_naming_where(text, words):
    with pytest.raises(ProtocolError) as info:
        parse_json(text, "body", param="body")
    assert info.value.message.startswith(f"body: {words}") and info.value.code is None
