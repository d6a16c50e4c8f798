"""Response bodies, chunks, logprobs (wire.responses), SSE framing and the error shape."""
from __future__ import annotations

import json

from wire.errors import ProtocolError, error_body
from wire.responses import (ResponseHeader, chat_logprobs, chunk, completion_logprobs,
                            full_response, usage_dict)
from wire.sse import SSE_DONE, data_of, sse


def test_usage_and_full_completion_body():
    header = ResponseHeader(id="cmpl-1", model="m", kind="completion", created=5)
    usage = usage_dict(3, 4, 2)
    assert usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                     "prompt_tokens_details": {"cached_tokens": 2}}
    body = full_response(header, "hey", "length", usage, {"e2e_s": 1.0})
    assert body == {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
                    "choices": [{"index": 0, "text": "hey", "logprobs": None,
                                 "finish_reason": "length"}],
                    "usage": usage, "metrics": {"e2e_s": 1.0}}


def test_chat_bodies_and_chunks():
    header = ResponseHeader(id="chatcmpl-1", model="m", kind="chat", created=5)
    body = full_response(header, "yo", "stop", usage_dict(1, 1, 0), None)
    assert body["object"] == "chat.completion" and "metrics" not in body
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "yo"}
    final = chunk(header, None, usage_dict(1, 1, 0), {"ttft_s": 0.1})
    assert final["object"] == "chat.completion.chunk" and final["choices"] == []
    assert final["metrics"] == {"ttft_s": 0.1}


def test_sse_framing():
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse("[DONE]") == b"data: [DONE]\n\n"


def test_logprob_formats():
    text = {7: "ab", 8: "c", 9: "é"}.__getitem__
    entries = [(-0.5, [(7, -0.5), (9, -1.0)]), (-0.25, [(8, -0.25)])]
    legacy = completion_logprobs(entries, [7, 8], text, text_offset=10)
    assert legacy == {"tokens": ["ab", "c"], "token_logprobs": [-0.5, -0.25],
                      "top_logprobs": [{"ab": -0.5, "é": -1.0}, {"c": -0.25}],
                      "text_offset": [10, 12]}
    chat = chat_logprobs(entries, [7, 9], text)
    assert chat["content"][1] == {"token": "é", "logprob": -0.25, "bytes": [195, 169],
                                  "top_logprobs": [{"token": "c", "logprob": -0.25,
                                                    "bytes": [99]}]}


def test_error_body_shape():
    err = ProtocolError.from_value_error(ValueError("prompt: 900 tokens do not fit"))
    assert err.param == "prompt"
    assert err.body() == {"error": {"type": "invalid_request_error",
                                    "message": "prompt: 900 tokens do not fit",
                                    "code": None, "param": "prompt"}}
    assert ProtocolError.from_value_error(ValueError("no field here")).param is None
    json.dumps(err.body())
    assert error_body("gone", 503, code="x")["error"]["type"] == "service_unavailable"
    assert error_body("boom", 500)["error"]["type"] == "server_error"


def test_sse_lines_read_back():
    assert data_of(sse({"a": 1}).decode().strip()) == {"a": 1}
    assert data_of(SSE_DONE.decode().strip()) is None
    assert data_of(": keep-alive") is None
