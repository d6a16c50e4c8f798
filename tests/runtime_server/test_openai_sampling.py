"""Issue 17 through the official openai client against a real replica: n > 1, penalties,
logit bias, min_p, min_tokens, stop_token_ids, batched prompts, echo; streams assemble to
the non-streamed answer and usage counts each prompt once."""
from __future__ import annotations

from collections import defaultdict

import openai
import pytest

from tests.runtime_server.conftest import SERVED_NAME

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]
PLAIN = {"ignore_eos": True}


def _assembled(chunks, kind: str) -> dict[int, str]:
    texts: dict[int, str] = defaultdict(str)
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += (choice.delta.content or "") if kind == "chat" else choice.text
    return dict(texts)


def test_n_samples_stream_like_the_full_answer_and_count_the_prompt_once(openai_client):
    args = dict(model=SERVED_NAME, messages=MESSAGES, n=3, max_tokens=6, temperature=1.0,
                seed=5, extra_body=PLAIN)
    full = openai_client.chat.completions.create(**args)
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert len({c.message.content for c in full.choices}) > 1      # three real samples
    single = openai_client.chat.completions.create(**{**args, "n": 1})
    assert full.usage.prompt_tokens == single.usage.prompt_tokens   # the prompt once
    assert full.usage.completion_tokens == 3 * 6
    assert full.choices[0].message.content == single.choices[0].message.content
    chunks = list(openai_client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    assert _assembled(chunks, "chat") == {c.index: c.message.content for c in full.choices}
    streamed = chunks[-1].usage       # (its prompt is in the prefix cache by now)
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (full.usage.prompt_tokens, 18)
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    assert sorted(roles) == [0, 1, 2]


def test_batched_prompts_times_n_are_indexed_prompt_major(openai_client):
    prompts = [PROMPT, "Paged attention stores keys"]
    got = openai_client.completions.create(model=SERVED_NAME, prompt=prompts, n=2,
                                           max_tokens=5, temperature=0, extra_body=PLAIN)
    alone = [openai_client.completions.create(model=SERVED_NAME, prompt=p, max_tokens=5,
                                              temperature=0, extra_body=PLAIN) for p in prompts]
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    assert [c.text for c in got.choices] == [alone[i].choices[0].text for i in (0, 0, 1, 1)]
    assert got.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert got.usage.completion_tokens == 4 * 5
    chunks = list(openai_client.completions.create(
        model=SERVED_NAME, prompt=prompts, n=2, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=PLAIN))
    assert _assembled(chunks, "completion") == {c.index: c.text for c in got.choices}
    assert chunks[-1].usage.total_tokens == got.usage.total_tokens


def test_echo_leads_with_the_prompt(openai_client):
    plain = openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=4,
                                             temperature=0, extra_body=PLAIN)
    echoed = openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=4,
                                              temperature=0, echo=True, extra_body=PLAIN)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    chunks = list(openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=4,
                                                   temperature=0, echo=True, stream=True,
                                                   extra_body=PLAIN))
    assert chunks[0].choices[0].text == PROMPT
    assert _assembled(chunks, "completion") == {0: echoed.choices[0].text}



def test_logit_bias_and_penalties_change_the_greedy_answer(openai_client):
    base = dict(model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
    plain = openai_client.completions.create(**base, extra_body=PLAIN).choices[0].text
    forced = openai_client.completions.create(**base, logit_bias={"65": 100}, extra_body=PLAIN)
    one = openai_client.completions.create(model=SERVED_NAME, prompt=[65], max_tokens=1,
                                           echo=True, extra_body=PLAIN).choices[0].text
    assert forced.choices[0].text.startswith(one[:1]) and forced.choices[0].text != plain
    penalized = openai_client.completions.create(**base, frequency_penalty=2.0,
                                                 presence_penalty=2.0,
                                                 extra_body={**PLAIN, "repetition_penalty": 2.0})
    assert penalized.choices[0].text != plain
    stream = list(openai_client.completions.create(**base, frequency_penalty=2.0,
                                                   presence_penalty=2.0, stream=True,
                                                   extra_body={**PLAIN, "repetition_penalty": 2.0}))
    assert _assembled(stream, "completion") == {0: penalized.choices[0].text}


def test_stop_token_ids_end_and_min_tokens_hold_them_back(openai_client, offline_llm):
    from runtime import SamplingParams

    ids = offline_llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0,
                                                        ignore_eos=True))[0].token_ids
    stop = ids[2]
    first = ids.index(stop)
    got = openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=8,
                                           temperature=0, extra_body={"stop_token_ids": [stop]})
    assert got.choices[0].finish_reason == "stop"
    assert got.usage.completion_tokens == first + 1
    held = openai_client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=0,
        extra_body={"stop_token_ids": [stop], "min_tokens": first + 2, "ignore_eos": True})
    assert held.usage.completion_tokens > first + 1


def test_min_p_of_one_is_greedy(openai_client):
    greedy = openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=8,
                                              temperature=0, extra_body=PLAIN)
    sampled = openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=8,
                                               temperature=1.5, extra_body={**PLAIN, "min_p": 1.0})
    assert sampled.choices[0].text == greedy.choices[0].text


@pytest.mark.parametrize("extra, param", [
    ({"n": 0}, "n"), ({"presence_penalty": 9}, "presence_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"min_p": 2}, "min_p"), ({"repetition_penalty": -1}, "repetition_penalty"),
])
def test_bad_values_are_400s_naming_the_field(openai_client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=2,
                                         extra_body=extra)
    assert err.value.body["param"] == param


def test_a_generating_replica_refuses_embeddings(client):
    resp = client.post("/v1/embeddings", json={"model": SERVED_NAME, "input": "x"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "model"


def test_the_replica_counters_count_the_prompt_once_like_the_usage(openai_client, client):
    """The pool reconciles the bill against /stats: both must count n samples the same."""
    before = client.get("/stats").json()
    got = openai_client.completions.create(model=SERVED_NAME, prompt=PROMPT, n=4, max_tokens=3,
                                           extra_body=PLAIN)
    after = client.get("/stats").json()
    assert after["prompt_tokens"] - before["prompt_tokens"] == got.usage.prompt_tokens
    assert after["completion_tokens"] - before["completion_tokens"] == 12
