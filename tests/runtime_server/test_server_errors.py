"""Refusals over HTTP: 400 naming the field, 404 for a wrong model, errors in OpenAI shape."""
from __future__ import annotations

import pytest

from tests.runtime_server.conftest import KV_CACHE_TOKENS, SERVED_NAME
from wire.errors import error_type


def post(client, path, body):
    return client.post(path, json=body)


def assert_error(resp, status: int, param):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"type", "message", "code", "param"}
    assert err["type"] == error_type(status) and err["param"] == param
    if param:
        assert err["message"].startswith(param)
    return err


@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"temperature": -1}, "temperature"),
    ({"frobnicate": True}, "frobnicate"),
    ({"n": 30}, "n"),
    ({"logit_bias": {"512": 1}}, "logit_bias"),   # outside the vocabulary: the replica knows
    ({"min_p": -0.5}, "min_p"),
    ({"prompt": [1, 2, 512]}, "prompt"),         # vocab is 512: id 512 is outside
    ({"stop_token_ids": [9999]}, "stop_token_ids"),
])
def test_completion_400s(client, extra, param):
    assert_error(post(client, "/v1/completions", {"prompt": "hi", **extra}), 400, param)


def test_chat_400s(client):
    assert_error(post(client, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 30,
                       "logprobs": True}), 400, "top_logprobs")
    assert_error(post(client, "/v1/chat/completions", {"messages": []}), 400, "messages")


def test_prompt_longer_than_the_cache_gets_the_engine_message(client):
    ids = [5] * (KV_CACHE_TOKENS + 10)
    err = assert_error(post(client, "/v1/completions", {"prompt": ids}), 400, "prompt")
    assert "tokens" in err["message"]
    streamed = post(client, "/v1/completions", {"prompt": ids, "stream": True})
    assert_error(streamed, 400, "prompt")   # refused before the stream starts


def test_invalid_json_is_400(client):
    resp = client.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert_error(resp, 400, "body")


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"prompt": "x", "a": ' + b"[" * 65 + b"]" * 65 + b"}"])
def test_a_body_nested_too_deep_is_400(client, raw):
    resp = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert assert_error(resp, 400, "body")["code"] == "too_deep"


@pytest.mark.parametrize("extra, param", [
    ({"guided_json": "[" * 100_000}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "[" * 100_000}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000}}]}]},
     "messages"),
])
def test_json_text_nested_too_deep_is_400(client, extra, param):
    body = {"messages": [{"role": "user", "content": "x"}], **extra}
    assert assert_error(post(client, "/v1/chat/completions", body), 400, param)["code"] == "too_deep"


def test_wrong_model_name_is_404(client):
    err = assert_error(post(client, "/v1/completions", {"prompt": "hi", "model": "other"}),
                       404, "model")
    assert SERVED_NAME in err["message"]


def test_openai_client_raises_bad_request(openai_client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=0)
    assert info.value.body["param"] == "max_tokens"


def test_server_still_serves_after_refusals(client):
    resp = post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
    assert resp.json()["choices"][0]["finish_reason"] == "length"


def test_unknown_paths_and_methods_answer_json(client):
    assert_error(client.get("/v1/nothing"), 404, None)
    assert_error(client.get("/v1/completions"), 405, None)
