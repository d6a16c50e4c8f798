"""What the gateway forwards and what it hands back to the client."""
from controlplane.gateway.openai_wire import (MAX_TOKENS, UsageSeen, client_chunk,
                                       estimate_completion_tokens, estimate_prompt_tokens,
                                       prefix_key, prompt_text, upstream_body)
from wire.requests import StreamOptions, parse_request

USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
         "prompt_tokens_details": {"cached_tokens": 3}}
CONTENT = {"id": "c", "model": "replica", "choices": [{"index": 0, "delta": {"content": "hi"},
                                                       "finish_reason": None}], "usage": USAGE}
FINAL = {"id": "c", "model": "replica", "choices": [], "usage": USAGE, "metrics": {"e2e_s": 1}}


def test_upstream_always_gets_cumulative_usage_and_no_model():
    body = upstream_body({"model": "chat", "stream": True, "messages": []})
    assert "model" not in body
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "stream_options" not in upstream_body({"model": "m", "prompt": "x"})


def test_usage_is_stripped_unless_the_client_asked():
    plain = StreamOptions()
    assert "usage" not in client_chunk(CONTENT, "chat", plain)
    assert client_chunk(FINAL, "chat", plain) is None
    assert client_chunk(CONTENT, "chat", plain)["model"] == "chat"


def test_include_usage_gives_openai_shape():
    options = StreamOptions(include_usage=True)
    assert client_chunk(CONTENT, "chat", options)["usage"] is None
    final = client_chunk(FINAL, "chat", options)
    assert final["usage"] == USAGE and "metrics" not in final


def test_continuous_usage_passes_through():
    options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    assert client_chunk(CONTENT, "chat", options)["usage"] == USAGE


def test_usage_seen_keeps_the_latest_cumulative_values():
    seen = UsageSeen()
    seen.observe(CONTENT)
    seen.observe({"choices": [{"finish_reason": "length"}],
                  "usage": {**USAGE, "completion_tokens": 9}})
    assert (seen.prompt_tokens, seen.cached_tokens, seen.completion_tokens) == (5, 3, 9)
    assert seen.finished


def test_prefix_key_depends_only_on_the_head():
    head = "x" * 512
    assert prefix_key(head + "tail one") == prefix_key(head + "tail two")
    assert prefix_key("a" + head) != prefix_key("b" + head)
    chat = parse_request("chat/completions", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert prompt_text(chat) == "user: hi"


def test_prompt_estimates_count_token_ids_exactly_and_text_by_characters():
    ids = parse_request("completions", {"prompt": [5, 6, 7]})
    assert estimate_prompt_tokens(ids, prompt_text(ids)) == 3
    text = parse_request("completions", {"prompt": "x" * 40})
    assert estimate_prompt_tokens(text, prompt_text(text)) == 11


def test_usage_counts_are_bounded_by_what_the_request_could_use():
    seen = UsageSeen(prompt_limit=100, completion_limit=40)
    seen.observe({"usage": {"prompt_tokens": 2 ** 70, "completion_tokens": 2 ** 40,
                            "prompt_tokens_details": {"cached_tokens": 2 ** 63}}})
    assert (seen.prompt_tokens, seen.cached_tokens, seen.completion_tokens) == (100, 100, 40)
    assert UsageSeen().prompt_limit == MAX_TOKENS < 2 ** 31


def test_a_malformed_usage_is_not_taken_and_the_gateways_counts_are_billed():
    seen = UsageSeen(estimated_prompt=12, counted_completion=3)
    for usage in ({"prompt_tokens": "5", "completion_tokens": 1}, {"prompt_tokens": -1},
                  {"prompt_tokens": float("nan"), "completion_tokens": 2}, [1, 2], 7):
        seen.observe({"usage": usage, "choices": "not a list"})
    assert seen.malformed and not seen.reported
    seen.fall_back()
    assert (seen.prompt_tokens, seen.cached_tokens, seen.completion_tokens) == (12, 0, 3)
    assert seen.as_openai()["total_tokens"] == 15


def test_a_completion_is_estimated_from_its_text_when_its_usage_cannot_be_taken():
    chat = {"choices": [{"message": {"role": "assistant", "content": "x" * 40}},
                        {"message": {"role": "assistant", "content": None}}, "junk"]}
    assert estimate_completion_tokens(chat) == 11
    assert estimate_completion_tokens({"choices": [{"text": "abc"}, {"text": "abcd"}]}) == 3
    assert estimate_completion_tokens({"choices": {"text": "abc"}}) == 0
