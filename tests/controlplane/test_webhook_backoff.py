"""The retry schedule and what follows an attempt, pure: no server, no clock."""
from datetime import datetime, timedelta, timezone

import pytest

from controlplane.webhooks.backoff import RetryPolicy, delay_s, retry_at
from controlplane.webhooks.deliveries import Attempt, Claimed, Next, after

T0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
POLICY = RetryPolicy(base_s=10, cap_s=100, max_attempts=5, max_age_s=1000)


def test_each_step_doubles_up_to_the_cap_without_jitter():
    assert [delay_s(POLICY, n, jitter=0.0) for n in range(1, 7)] == [5, 10, 20, 40, 50, 50]


def test_jitter_spreads_the_upper_half_of_each_step():
    assert [delay_s(POLICY, 3, jitter=j) for j in (0.0, 0.5, 0.999)] == pytest.approx([20, 30, 39.98])


def test_retry_at_adds_the_delay_to_now():
    assert retry_at(POLICY, 2, T0, T0 + timedelta(seconds=7), jitter=1.0) == \
        T0 + timedelta(seconds=27)


def test_a_delivery_is_given_up_after_max_attempts():
    assert retry_at(POLICY, 4, T0, T0, jitter=0.0) is not None
    assert retry_at(POLICY, 5, T0, T0, jitter=0.0) is None


def test_a_delivery_is_given_up_when_the_next_try_passes_max_age():
    assert retry_at(POLICY, 1, T0, T0 + timedelta(seconds=995), jitter=0.0) == \
        T0 + timedelta(seconds=1000)
    assert retry_at(POLICY, 1, T0, T0 + timedelta(seconds=996), jitter=0.0) is None


def claimed(attempt: int) -> Claimed:
    return Claimed("d", "c", attempt, "evt_1", "webhook.test", T0, b"{}", "http://x/",
                   "e", b"", False)


@pytest.mark.parametrize("status, error, attempt, expected", [
    (200, None, 1, Next("succeeded", None)),
    (204, None, 5, Next("succeeded", None)),
    (500, None, 1, Next("pending", T0 + timedelta(seconds=5))),
    (302, None, 2, Next("pending", T0 + timedelta(seconds=10))),     # redirects are not followed
    (None, "ConnectError", 3, Next("pending", T0 + timedelta(seconds=20))),
    (500, None, 5, Next("failed", None)),
])
def test_after_an_attempt(status, error, attempt, expected):
    tried = Attempt(T0, 1.0, status, error)
    assert after(tried, claimed(attempt), POLICY, T0, jitter=0.0) == expected
