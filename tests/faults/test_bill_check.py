"""The fault suite's own bill check (bill.assert_billed_as_received), on made-up rows: it
must still fail a bill that is ahead of the delivery, or more than one chunk behind."""
import pytest

from tests.faults.bill import assert_billed_as_received
from tests.faults.traffic import Call, Ledger


def _cut_call() -> Call:
    # read usage 1, then 3, then 4 completion tokens; the stream was cut (no finish_reason)
    return Call("r1", "t", 0.0, status=0, prompt_tokens=33, completion_tokens=4, previous_completion_tokens=3)


def _row(completion: int, recovered: bool, status: str = "partial") -> dict:
    return {"request_id": "r1", "status": status, "prompt_tokens": 33, "completion_tokens": completion,
            "recovered": recovered}


def test_exact_and_one_chunk_behind_pass():
    ledger = Ledger([_cut_call()])
    assert_billed_as_received(ledger, [_row(4, recovered=True)], "t")
    assert_billed_as_received(ledger, [_row(3, recovered=True)], "t")       # the journal's window


@pytest.mark.parametrize("row", [
    _row(5, recovered=True),          # ahead of what the client received
    _row(1, recovered=True),          # two chunks behind
    _row(3, recovered=False),         # a gateway's own row has no window
])
def test_ahead_or_further_behind_fails(row):
    with pytest.raises(AssertionError):
        assert_billed_as_received(Ledger([_cut_call()]), [row], "t")
