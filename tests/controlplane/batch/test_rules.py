"""controlplane.batch.rules: capacity, refusals and a batch's next step, with no clock."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from controlplane.batch.rules import (BatchState, Capacity, Fail, NextStep, Retry, after_refusal,
                                      next_step, spare_slots)

T0 = datetime(2027, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("capacity, spare", [
    (Capacity(0, 0, 8, 0), 1),        # scaled to zero: one line thaws it, as one call would
    (Capacity(0, 0, 8, 1), 0),        # ...and no more wait on that thaw
    (Capacity(1, 0, 8, 0), 8),
    (Capacity(1, 6, 8, 2), 2),        # 4 interactive + 2 batch: room for 2
    (Capacity(1, 8, 8, 0), 0),        # interactive fills it: batch waits, the autoscaler sees no extra load
    (Capacity(2, 3, 4, 5), 3),        # batch lines still acquiring count before the pool sees them
    (Capacity(1, 12, 8, 0), 0),
])
def test_lines_only_take_what_ready_replicas_leave_idle(capacity, spare):
    assert spare_slots(capacity) == spare


def test_a_throttle_waits_without_using_an_attempt():
    assert after_refusal(429, "rate_limit", "slow down", 5, 5, T0, 2.0) == \
        Retry(T0 + timedelta(seconds=2), counts_as_attempt=False)


def test_transient_refusals_back_off_then_fail():
    assert after_refusal(503, "cold_start_timeout", "cold", 1, 3, T0, 2.0) == \
        Retry(T0 + timedelta(seconds=2), True)
    assert after_refusal(502, None, "gone", 2, 3, T0, 2.0) == Retry(T0 + timedelta(seconds=4), True)
    assert after_refusal(502, None, "gone", 3, 3, T0, 2.0) == Fail("http_502", "gone")


def test_a_bad_request_fails_at_once_with_its_code():
    assert after_refusal(400, "invalid_request", "max_tokens: too big", 1, 5, T0, 2.0) == \
        Fail("invalid_request", "max_tokens: too big")
    assert after_refusal(404, "deployment_not_found", "gone", 1, 5, T0, 2.0) == \
        Fail("deployment_not_found", "gone")


def state(status="in_progress", pending=0, running=0, expires=T0 + timedelta(hours=24)):
    return BatchState(status, expires, pending, running)


def test_a_batch_completes_once_every_line_has_ended():
    assert next_step(state(pending=3, running=1), T0) == NextStep()
    assert next_step(state(running=1), T0) == NextStep()
    assert next_step(state(), T0) == NextStep(None, "completed")


def test_expiry_ends_the_lines_not_started_and_waits_for_the_running_ones():
    late = T0 + timedelta(hours=25)
    assert next_step(state(pending=3, running=1), late) == NextStep("expired", None)
    assert next_step(state(pending=3), late) == NextStep("expired", "expired")
    assert next_step(state(), late) == NextStep(None, "expired")


def test_cancelling_wins_over_expiry_and_keeps_running_lines():
    late = T0 + timedelta(hours=25)
    assert next_step(state("cancelling", pending=2, running=1), T0) == NextStep("cancelled", None)
    assert next_step(state("cancelling"), late) == NextStep(None, "cancelled")
