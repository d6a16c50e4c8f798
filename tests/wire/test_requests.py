"""Request parsing and validation (wire.requests), with no server."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from wire.errors import ProtocolError
from wire.requests import (CHAT_FIELDS, COMPLETION_FIELDS, StreamOptions, parse_chat_request,
                           parse_completion_request, parse_request)


def refusal(parse, body) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


def test_completion_maps_fields_to_sampling_params():
    req = parse_completion_request({
        "model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
        "top_k": 3, "seed": 11, "stop": "x", "ignore_eos": True, "logprobs": 2, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "n": 1})
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.ignore_eos,
            p.logprobs) == (7, 0, 0.5, 3, 11, ["x"], True, 2)
    assert (req.kind, req.prompt, req.model, req.stream, req.logprobs) == ("completion", "hi", "m", True, 2)
    assert req.stream_options == StreamOptions(include_usage=True, continuous_usage_stats=True)


def test_completion_defaults_follow_openai():
    req = parse_completion_request({"prompt": [1, 2, 3]})
    assert req.prompt == [1, 2, 3]
    assert req.params.max_tokens == 16 and req.params.logprobs is None and not req.stream
    assert parse_completion_request({"prompt": ["one"]}).prompt == "one"


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "8"}, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "top_k": -1}, "top_k"),
    ({"prompt": "x", "seed": -3}, "seed"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 17}, "n"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"3": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [1]}, "logit_bias"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"),
    ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "x", "echo": True, "logprobs": 2}, "echo"),
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": "x", "bogus": 1}, "bogus"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": {"nope": True}}, "stream_options"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt"),
    ({"prompt": ["a"] * 65}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({}, "prompt"),
])
def test_completion_refusals_name_the_field(body, param):
    err = refusal(parse_completion_request, body)
    assert err.param == param
    assert str(err).startswith(param)


def test_chat_parses_messages_and_logprobs():
    req = parse_chat_request({
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]}],
        "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 5})
    assert req.messages == [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": "ab"}]
    assert req.logprobs == 3 and req.params.logprobs == 3
    assert req.params.max_tokens == 5 and req.max_tokens_given


def test_chat_without_max_tokens_is_filled_later():
    req = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})
    assert not req.max_tokens_given and req.logprobs is None
    assert req.with_max_tokens(99).params.max_tokens == 99


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "prompt"),
])
def test_chat_refusals_name_the_field(body, param):
    assert refusal(parse_chat_request, body).param == param


def test_non_object_body_is_refused():
    assert refusal(parse_completion_request, [1, 2]).param is None


@given(st.sets(st.text(alphabet="abcdefghij_", min_size=1, max_size=8), min_size=1, max_size=4))
def test_any_unknown_field_is_named(names):
    unknown = sorted(names - COMPLETION_FIELDS)
    body = {"prompt": "x", **{n: 1 for n in names}}
    if unknown:
        assert refusal(parse_completion_request, body).param == unknown[0]
    chat_unknown = sorted(names - CHAT_FIELDS)
    if chat_unknown:
        chat = {"messages": [{"role": "user", "content": "x"}], **{n: 1 for n in names}}
        assert refusal(parse_chat_request, chat).param == chat_unknown[0]


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-2, max_value=2))
def test_top_p_accepted_exactly_on_the_open_closed_interval(top_p):
    body = {"prompt": "x", "top_p": top_p}
    if 0 < top_p <= 1:
        assert parse_completion_request(body).params.top_p == top_p
    else:
        assert refusal(parse_completion_request, body).param == "top_p"


def test_parse_request_picks_the_parser_by_endpoint():
    assert parse_request("completions", {"prompt": "x"}).kind == "completion"
    chat = parse_request("chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert chat.kind == "chat"
    assert parse_request("embeddings", {"input": "x"}).kind == "embedding"
    with pytest.raises(ValueError, match="unknown endpoint"):
        parse_request("moderations", {"input": "x"})


def test_one_max_tokens_rule():
    given_ = parse_chat_request({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9})
    assert given_.max_tokens_within(context_len=100, prompt_len=30) == 9
    open_ = parse_chat_request({"messages": [{"role": "user", "content": "x"}]})
    assert open_.max_tokens_within(context_len=100, prompt_len=30) == 70
    assert open_.max_tokens_within(context_len=100, prompt_len=100) == 1
    completion = parse_completion_request({"prompt": "x"})
    assert completion.max_tokens_within(context_len=100, prompt_len=30) == 16


def test_completion_batch_penalties_and_echo_parse():
    req = parse_completion_request({
        "prompt": ["one", [1, 2]], "n": 3, "echo": True, "presence_penalty": -1,
        "frequency_penalty": 0.5, "repetition_penalty": 1.2, "logit_bias": {"7": -100},
        "min_p": 0.1, "min_tokens": 2, "stop_token_ids": [3]})
    assert req.prompts == ["one", [1, 2]] and req.prompt == "one" and req.echo
    p = req.params
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (3, -1, 0.5, 1.2)
    assert (p.logit_bias, p.min_p, p.min_tokens, p.stop_token_ids) == ({7: -100}, 0.1, 2, [3])
    assert parse_completion_request({"prompt": "x"}).prompts == ["x"]
