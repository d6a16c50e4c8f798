"""Structured outputs through the engine (runtime/engine/structured_output.py), on a tiny random model.

The property: whatever JSON schema (nested objects, arrays, enums, bounded numbers,
required fields), every output parses and validates, greedy and sampled, in a batch with
requests that carry no format, whose outputs stay exactly what they are alone. A random
model has no wish to end anything, so the generated schemas describe finite languages
(strings with maxLength, arrays with maxItems, numbers with bounds and a multipleOf,
no additional properties): an output that runs into max_tokens is a failure here.
multipleOf is a power of two: jsonschema checks it in floats, so it calls 10.6 no
multiple of 0.1 (10.6 / 0.1 == 105.99999999999999); the engine is right there.
"""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import LLM, SamplingParams
from runtime.engine.structured_output import TokenMask
from wire.requests import parse_request
from wire.response_format import json_schema_output

MAX_TOKENS = 400
PLAIN_PROMPTS = ["The quick brown fox", "def add(a, b):"]


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model), device="cpu", dtype="float32", max_num_seqs=16)


def plain_params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
            SamplingParams(max_tokens=12, temperature=0.9, seed=11, ignore_eos=True)]


@pytest.fixture(scope="module")
def plain_alone(llm):
    """The no-format requests' outputs, each run alone."""
    return [llm.generate([prompt], p)[0].token_ids for prompt, p in zip(PLAIN_PROMPTS, plain_params())]


# ---------------------------------------------------------------- schemas

NAMES = st.sampled_from(["id", "name", "tags", "price", "ok", "kind", "items", "meta"])


def leaves() -> st.SearchStrategy[dict]:
    integers = st.tuples(st.integers(-50, 50), st.integers(0, 200)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]})
    numbers = st.tuples(st.integers(-10, 10), st.integers(1, 20), st.sampled_from([0.5, 0.25, 0.125])).map(
        lambda t: {"type": "number", "minimum": t[0], "maximum": t[0] + t[1], "multipleOf": t[2]})
    strings = st.integers(1, 4).map(lambda n: {"type": "string", "maxLength": n})
    enums = st.lists(st.one_of(st.sampled_from(["red", "green", "blue"]), st.integers(0, 9)),
                     min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v})
    return st.one_of(integers, numbers, strings, enums, st.just({"type": "boolean"}))


def objects(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    def build(props: dict, data: st.DataObject) -> dict:
        required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return st.builds(build, st.dictionaries(NAMES, children, min_size=1, max_size=3), st.data())


def arrays(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    return st.tuples(children, st.integers(0, 2), st.integers(0, 1)).map(
        lambda t: {"type": "array", "items": t[0], "maxItems": t[1], "minItems": min(t[1], t[2])})


SCHEMAS = st.recursive(leaves(), lambda inner: st.one_of(objects(inner), arrays(inner)), max_leaves=4)
TOP_LEVEL = st.one_of(objects(SCHEMAS), arrays(SCHEMAS))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(schema=TOP_LEVEL, seed=st.integers(0, 2**16))
def test_every_output_parses_and_validates_beside_untouched_plain_requests(llm, plain_alone, schema, seed):
    output = json_schema_output(schema)
    guided = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured_output=output),
              SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, structured_output=output)]
    outs = llm.generate(["Answer in JSON:", "Answer in JSON:", *PLAIN_PROMPTS], guided + plain_params())
    for out in outs[:2]:
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    assert [o.token_ids for o in outs[2:]] == plain_alone


# ---------------------------------------------------------------- the other formats

def request_params(body: dict, max_tokens: int = 64, temperature: float = 1.0, seed: int = 1) -> SamplingParams:
    parsed = parse_request("completions", {"prompt": "x", "max_tokens": max_tokens,
                                           "temperature": temperature, "seed": seed, **body})
    return parsed.params


def test_guided_choice_regex_and_grammar_hold_for_several_seeds(llm):
    choice = request_params({"guided_choice": ["yes", "no", "maybe not"]})
    regex = request_params({"guided_regex": r"[a-f]{2,4}-[0-9]{3}"})
    lark = request_params({"guided_grammar": 'start: "(" num ("," num)* ")"\nnum: /[0-9]/'}, max_tokens=200)
    gbnf = request_params({"guided_grammar": 'root ::= "on" | "off"'})
    params = [replace_seed(p, s) for p in (choice, regex, lark, gbnf) for s in (1, 2, 3)]
    outs = llm.generate(["Pick one:"] * len(params), params)
    texts = [o.text for o in outs]
    assert all(t in {"yes", "no", "maybe not"} for t in texts[0:3]), texts
    assert all(re.fullmatch(r"[a-f]{2,4}-[0-9]{3}", t) for t in texts[3:6]), texts
    assert all(re.fullmatch(r"\([0-9](,[0-9])*\)", t) for t in texts[6:9]), texts
    assert all(t in {"on", "off"} for t in texts[9:12]), texts
    assert all(o.finish_reason == "stop" for o in outs)


def replace_seed(p: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace
    return replace(p, seed=seed)


def test_json_object_mode_and_n_samples_each_parse(llm):
    # any object is an infinite language: a random model may not close it, so ask a few
    # times and require that what did close parses, and that at least one did
    p = request_params({"response_format": {"type": "json_object"}, "n": 2}, max_tokens=40, seed=1)
    outs = llm.generate(["{"], p)
    assert len(outs) == 2
    closed = [o for o in outs if o.finish_reason == "stop"]
    assert closed
    assert all(isinstance(json.loads(o.text), dict) for o in closed)


def test_a_grammar_the_tokenizer_cannot_start_is_refused_by_the_engine(llm):
    bad = request_params({"guided_regex": "a"})
    from dataclasses import replace
    from wire.response_format import StructuredOutput
    broken = replace(bad, structured_output=StructuredOutput(field="guided_regex", grammar="start: nope"))
    with pytest.raises(ValueError, match="^guided_regex: "):
        llm.engine.add_request("bad", [1, 2, 3], broken)


# ---------------------------------------------------------------- the mask itself

def test_token_mask_keeps_exactly_the_allowed_tokens_of_its_rows():
    logits = torch.zeros(3, 70)
    bitmask = np.zeros((1, 3), dtype=np.uint32)
    bitmask[0, 0] = 1 << 5                # token 5
    bitmask[0, 1] = 1 << 31               # token 63
    bitmask[0, 2] = 1 << 1                # token 65
    TokenMask(rows=[1], bitmask=bitmask.view(np.int32)).apply(logits)
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [5, 63, 65]
    assert torch.isfinite(logits[[0, 2]]).all()
