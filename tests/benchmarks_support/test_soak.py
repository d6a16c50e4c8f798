"""benchmarks/soak.py's summary: the share of calls that failed, counted by reason."""
from benchmarks.soak import failures_by_reason
from tests.faults.traffic import Call


def _call(status: int = 200, finished: bool = True, error: str | None = None) -> Call:
    return Call("r", "t", 0.0, status=status, finished=finished, error=error)


def test_the_failed_share_and_its_reasons():
    calls = [_call() for _ in range(95)] + [
        _call(0, False, "APIConnectionError: Connection error."),
        _call(0, False, "APIConnectionError: Connection error."),
        _call(502, False, "Error code: 502 - {'error': 'replica unreachable'}"),
        _call(502, False, "APIError: the replica's answer broke off"),
        _call(200, False),
    ]
    assert failures_by_reason(calls) == (
        "failed calls: 5 of 100 (5.00%); by reason: 2 connection failed or cut (APIConnectionError); "
        "1 HTTP 502; 1 error event mid-stream (APIError); 1 200, stream ended without a finish_reason")


def test_no_failure():
    assert failures_by_reason([_call()]) == "failed calls: 0 of 1 (0.00%); by reason: none"
