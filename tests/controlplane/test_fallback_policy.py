"""The fallback decision, with no server and no clock: which attempt comes next after
which failure, how long a cold deployment is waited for, and what each refusal counts as."""
import pytest

from controlplane.deploy.fallback_spec import Fallback
from controlplane.gateway.fallback_policy import (PRIMARY, answer_condition, next_attempt,
                                                  pool_condition, replica_wait_s)
from pool.api import (AdapterRefused, ColdStartFailed, ColdStartTimeout, ModelUnavailable, NeverFits,
                      QueueFull, QuotaExceeded)

ACQUIRE_S = 60.0
ERRORS_ONLY = Fallback("b", ("error",))
COLD_2S = Fallback("c", ("cold",), cold_wait_s=2.0)
ANY_9S = Fallback("d", ("cold", "rate_limited", "error"), cold_wait_s=9.0)
LIST = (ERRORS_ONLY, COLD_2S, ANY_9S)


@pytest.mark.parametrize("after, condition, expected", [
    (PRIMARY, "error", 1),            # the first entry listing it
    (PRIMARY, "cold", 2),             # b is for errors only: passed over
    (PRIMARY, "rate_limited", 3),
    (1, "error", 3),                  # b failed too: the next that lists error
    (1, "cold", 2),                   # b was cold: c takes cold calls
    (2, "cold", 3),
    (3, "error", None),               # the last entry failed: the call answers with it
    (3, "cold", None),
])
def test_the_next_attempt_is_the_first_later_entry_listing_what_happened(after, condition, expected):
    assert next_attempt(LIST, after, condition) == expected


def test_no_fallbacks_no_next_attempt():
    for condition in ("cold", "rate_limited", "error"):
        assert next_attempt((), PRIMARY, condition) is None


def test_a_cold_deployment_is_waited_for_as_long_as_the_entry_a_cold_call_goes_to_says():
    assert replica_wait_s(LIST, PRIMARY, ready=False, acquire_timeout_s=ACQUIRE_S) == 2.0
    assert replica_wait_s(LIST, 1, ready=False, acquire_timeout_s=ACQUIRE_S) == 2.0
    assert replica_wait_s(LIST, 2, ready=False, acquire_timeout_s=ACQUIRE_S) == 9.0
    # the last one has nowhere to go: the gateway's own timeout
    assert replica_wait_s(LIST, 3, ready=False, acquire_timeout_s=ACQUIRE_S) == ACQUIRE_S


def test_a_warm_deployment_and_a_list_without_cold_wait_the_acquire_timeout():
    assert replica_wait_s(LIST, PRIMARY, ready=True, acquire_timeout_s=ACQUIRE_S) == ACQUIRE_S
    assert replica_wait_s((ERRORS_ONLY,), PRIMARY, ready=False, acquire_timeout_s=ACQUIRE_S) == ACQUIRE_S
    assert replica_wait_s((), PRIMARY, ready=False, acquire_timeout_s=ACQUIRE_S) == ACQUIRE_S


def test_a_cold_wait_never_exceeds_the_acquire_timeout():
    long_wait = (Fallback("b", ("cold",), cold_wait_s=500.0),)
    assert replica_wait_s(long_wait, PRIMARY, ready=False, acquire_timeout_s=ACQUIRE_S) == ACQUIRE_S


@pytest.mark.parametrize("refusal, condition", [
    (ColdStartTimeout("no replica ready after 2s"), "cold"),
    (QuotaExceeded("waiting for GPU quota"), "rate_limited"),
    (QueueFull("10 requests already wait"), "rate_limited"),
    (ColdStartFailed("the replica exited"), "error"),
    # refusals of the request itself: a fallback would refuse it too, or it is a 422
    (NeverFits("never placed"), None),
    (ModelUnavailable("no config.json"), None),
    (AdapterRefused("bad adapter"), None),
])
def test_what_each_pool_refusal_counts_as(refusal, condition):
    assert pool_condition(refusal) == condition


@pytest.mark.parametrize("status, condition", [
    (200, None), (400, None), (422, None), (429, None), (499, None),
    (500, "error"), (502, "error"), (503, "error")])
def test_a_replica_answer_is_an_error_only_when_5xx(status, condition):
    assert answer_condition(status) == condition
