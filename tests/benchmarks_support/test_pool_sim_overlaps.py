"""benchmarks/pool_sim_validation.by_overlap: real first tokens grouped by the requests in
flight during each one's wait."""
import json

from benchmarks.pool_sim_validation import Answered, by_overlap, read_answered


def test_requests_are_grouped_by_the_others_in_flight_during_their_wait():
    lives = [Answered(0.0, 0.010, 0.050),     # alone: nothing else sent before 0.010
             Answered(1.0, 1.030, 1.100),     # waits while the next two are in flight
             Answered(1.005, 1.020, 1.060),   # the one before is still waiting
             Answered(1.025, 1.040, 1.090),   # both before are in flight
             Answered(1.095, 1.110, 1.200)]   # only the second's decode is left
    found = by_overlap(lives, most=2)
    assert {k: sorted(round(t, 3) for t in v) for k, v in found.items()} == \
        {0: [0.010], 1: [0.015, 0.015], 2: [0.015, 0.030]}


def test_from_most_on_the_counts_are_grouped():
    lives = [Answered(0.0, 1.0, 2.0)] + [Answered(0.1 * i, 0.1 * i + 0.01, 1.5) for i in range(1, 6)]
    assert max(by_overlap(lives, most=3)) == 3


def test_a_request_that_ends_before_another_is_sent_does_not_count():
    found = by_overlap([Answered(0.0, 0.01, 0.02), Answered(0.03, 0.04, 0.05)])
    assert {k: len(v) for k, v in found.items()} == {0: 2}


def test_kept_requests_are_read_back_answered_only(tmp_path):
    rows = [{"at_s": 1.0, "ttft_s": 0.02, "total_s": 0.1, "status": 200},
            {"at_s": 2.0, "ttft_s": None, "total_s": 0.1, "status": 429}]
    path = tmp_path / "real_requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_answered(path) == [Answered(1.0, 1.02, 1.1)]
