"""`thawpool deploy` flags into the deployment body (no server: an s3:// model needs no lookup)."""
import pytest

from controlplane.cli.main import build_parser
from controlplane.cli.output import UsageError
from controlplane.cli.deploy import _body

MODEL = "s3://models/m/"


def body_of(*flags: str) -> dict:
    return _body(build_parser().parse_args(["deploy", "d", "--model", MODEL, *flags]), client=None)


def test_prefetch_is_sent_only_when_given():
    assert "scaling" not in body_of()
    assert body_of("--prefetch")["scaling"] == {"prefetch": True}
    assert body_of("--no-prefetch", "--sleep-timeout", "30")["scaling"] == {"sleep_timeout_s": 30.0,
                                                                            "prefetch": False}


def test_fallbacks_in_order_with_their_conditions_and_wait():
    assert "fallbacks" not in body_of()
    assert body_of("--fallback", "small", "--fallback", "other:cold,error:2.5")["fallbacks"] == [
        {"deployment": "small"},
        {"deployment": "other", "on": ["cold", "error"], "cold_wait_s": 2.5}]
    assert body_of("--fallback", "small::3")["fallbacks"] == [{"deployment": "small", "cold_wait_s": 3.0}]
    assert body_of("--fallback", "")["fallbacks"] == [], "an empty one clears the list"


def test_a_fallback_wait_that_is_not_a_number_is_a_usage_error():
    with pytest.raises(UsageError):
        body_of("--fallback", "small:cold:soon")
