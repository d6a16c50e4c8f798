"""`fallbacks` in a deployment body: what is taken, and each refusal naming its field."""
import pytest

from controlplane.deploy.deployment_spec import parse_create, parse_patch
from controlplane.deploy.fallback_spec import (CONDITIONS, MAX_FALLBACKS, Fallback, Serves, from_stored,
                                               mismatch, parse_fallbacks)
from controlplane.store.errors import InvalidField

URI = "s3://models/tiny/"


def test_entries_keep_their_order_and_default_to_every_condition():
    parsed = parse_fallbacks([{"deployment": "b", "on": ["error", "cold"], "cold_wait_s": 1.5},
                              {"deployment": "c"}], "a")
    assert parsed == (Fallback("b", ("cold", "error"), 1.5), Fallback("c", CONDITIONS, 5.0))


def test_the_stored_form_reads_back_the_same():
    parsed = parse_fallbacks([{"deployment": "b", "on": ["rate_limited"], "cold_wait_s": 0}], "a")
    assert from_stored([f.as_json() for f in parsed]) == parsed


@pytest.mark.parametrize("value, field", [
    ({"deployment": "b"}, "fallbacks"),                                   # not a list
    ([{"deployment": "a"}], "fallbacks[0].deployment"),                   # itself
    ([{"deployment": "b"}, {"deployment": "b"}], "fallbacks[1].deployment"),
    ([{"deployment": ""}], "fallbacks[0].deployment"),
    ([{"on": ["cold"]}], "fallbacks[0].deployment"),
    (["b"], "fallbacks[0]"),
    ([{"deployment": "b", "on": []}], "fallbacks[0].on"),
    ([{"deployment": "b", "on": "cold"}], "fallbacks[0].on"),
    ([{"deployment": "b", "on": ["slow"]}], "fallbacks[0].on"),
    ([{"deployment": "b", "cold_wait_s": -1}], "fallbacks[0].cold_wait_s"),
    ([{"deployment": "b", "cold_wait_s": 601}], "fallbacks[0].cold_wait_s"),
    ([{"deployment": "b", "cold_wait_s": True}], "fallbacks[0].cold_wait_s"),
    ([{"deployment": "b", "when": ["cold"]}], "fallbacks[0].when"),
    ([{"deployment": f"f{i}"} for i in range(MAX_FALLBACKS + 1)], "fallbacks"),
])
def test_refusals_name_the_field(value, field):
    with pytest.raises(InvalidField) as refused:
        parse_fallbacks(value, "a")
    assert refused.value.field == field


def test_create_and_patch_bodies_carry_them():
    spec = parse_create({"name": "a", "model_uri": URI, "fallbacks": [{"deployment": "b"}]})
    assert spec.fallbacks == (Fallback("b"),)
    assert parse_create({"name": "a", "model_uri": URI}).fallbacks == ()
    assert parse_patch({"fallbacks": []}).fallbacks == ()
    assert parse_patch({"scaling": {"max_replicas": 2}}).fallbacks is None    # unchanged
    with pytest.raises(InvalidField) as refused:
        parse_create({"name": "a", "model_uri": URI, "fallbacks": [{"deployment": "a"}]})
    assert refused.value.field == "fallbacks[0].deployment"


def test_a_model_falls_back_to_a_model_with_the_same_task():
    chat = Serves("model", "generate")
    assert mismatch(chat, Serves("model", "generate")) is None
    assert "function" in mismatch(chat, Serves("function", "generate"))
    assert "embed" in mismatch(chat, Serves("model", "embed"))
