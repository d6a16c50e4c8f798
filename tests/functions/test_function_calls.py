"""The rules of asynchronous calls, over a `now` passed in: ids, outcomes, retention,
the sweep's timing, the answer of a call cut by a restart. No database, no clock."""
from datetime import datetime, timedelta, timezone

from controlplane.gateway.async_call_rules import (FAILED, RESTARTED, RUNNING, SUCCEEDED, SweepState,
                                         cut_by_restart, expired_before, finished, is_call_id,
                                         is_expired, new_call, sweep_due)

T0 = datetime(2027, 4, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_call_is_kept_until_its_retention_after_it_ends():
    call = new_call("acme", "sentiment", at(0))
    assert is_call_id(call.id) and call.status == RUNNING
    assert call.view() == {"id": call.id, "object": "function.call", "function": "sentiment",
                           "status": "running"}
    done = finished(call, 200, {"output": {"label": "positive"}}, at(10))
    assert done.view() == {"id": call.id, "object": "function.call", "function": "sentiment",
                           "status": "succeeded", "http_status": 200,
                           "output": {"label": "positive"}}
    assert not is_expired(done, at(69.999), retention_s=60)
    assert is_expired(done, at(70), retention_s=60)                  # exactly at the end: gone
    assert expired_before(at(70), 60) == at(10), "the sweep's cutoff is the reads' rule"


def test_a_running_call_never_expires_and_any_other_status_is_a_failure():
    running = new_call("acme", "f", at(0))
    assert not is_expired(running, at(1e9), retention_s=1)
    assert [finished(running, status, {}, at(1)).status for status in (200, 400, 429, 500, 502)] \
        == [SUCCEEDED, FAILED, FAILED, FAILED, FAILED]


def test_only_well_formed_ids_are_looked_up():
    assert is_call_id("call-" + "0" * 32)
    for other in ("call-0", "call-" + "0" * 33, "call-" + "A" * 32, "x" + "0" * 32,
                  "call-" + "0" * 31 + "\x00"):
        assert not is_call_id(other), other


def test_a_sweep_is_due_first_then_every_interval_and_at_once_after_a_full_batch():
    assert sweep_due(SweepState(), at(0), every_s=60)
    assert not sweep_due(SweepState(at(0)), at(59.9), every_s=60)
    assert sweep_due(SweepState(at(0)), at(60), every_s=60)
    assert sweep_due(SweepState(at(0), full=True), at(0.1), every_s=60)


def test_a_call_cut_by_a_restart_tells_its_client_to_invoke_again():
    status, body = cut_by_restart()
    assert status == 503 and body["error"]["code"] == RESTARTED
    assert "invoke the function again" in body["error"]["message"]
    view = finished(new_call("acme", "f", at(0)), status, body, at(1)).view()
    assert (view["status"], view["http_status"], view["error"]["code"]) == (FAILED, 503, RESTARTED)
