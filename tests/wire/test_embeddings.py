"""/v1/embeddings requests and answers, pure."""
from __future__ import annotations

import base64
import struct

import pytest

from wire.embeddings import embedding_response, parse_embedding_request
from wire.errors import ProtocolError
from wire.requests import parse_request


def test_inputs_parse_as_prompts_and_the_gateway_sees_a_prefill():
    req = parse_embedding_request({"model": "m", "input": ["a", [1, 2]],
                                   "encoding_format": "base64"})
    assert req.inputs == ["a", [1, 2]] and req.encoding_format == "base64"
    seen = parse_request("embeddings", {"model": "m", "input": "one"})
    assert (seen.kind, seen.prompts, seen.params.max_tokens) == ("embedding", ["one"], 1)


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [1, -1]}, "input"),
    ({}, "input"), ({"input": "x", "dimensions": 8}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "stream": True}, "stream"),
])
def test_refusals_name_the_field(body, param):
    with pytest.raises(ProtocolError) as err:
        parse_embedding_request(body)
    assert err.value.param == param and err.value.message.startswith(param)


def test_base64_is_little_endian_float32_and_usage_counts_inputs():
    body = embedding_response("m", [[0.5, -1.0], [0.25, 2.0]], "base64", 7)
    raw = base64.b64decode(body["data"][1]["embedding"])
    assert struct.unpack("<2f", raw) == (0.25, 2.0)
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert embedding_response("m", [[0.5]], "float", 1)["data"][0]["embedding"] == [0.5]
