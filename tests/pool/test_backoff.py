"""The crash backoff policy: pure, fake time passed in."""
from pool.backoff import Backoff, BackoffConfig, Failure, after_failure, may_start, refusing_for_s


def test_crash_backoff_doubles_and_a_first_crash_after_serving_is_replaced_at_once():
    config = BackoffConfig(base_s=1, cap_s=8)

    def fail(state, now, ready_at):
        return after_failure(state, Failure(now=now, ready_at=ready_at), config)

    never_ready, delays = Backoff(), []
    for _ in range(5):
        never_ready, delay = fail(never_ready, 10.0, None)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 8]
    assert (never_ready.start_after, never_ready.refuse_until) == (18.0, 18.0)   # failed cold start: refuse
    assert not may_start(never_ready, 17.5) and may_start(never_ready, 18.0)
    assert refusing_for_s(never_ready, 17.5) == 0.5 and refusing_for_s(never_ready, 18.0) is None

    served = Backoff()                                                # ready at t=3
    served, first = fail(served, 5.0, 3.0)
    assert first == 0                                                 # first crash: replace now
    served, second = fail(served, 6.0, 3.0)
    assert second == 1                                                # repeated: back off
    served, third = fail(served, 7.0, 3.0)
    assert third == 2
    assert served.refuse_until == 0.0                                 # it served: requests queue, no refusal
    assert fail(served, 3.0 + 8, 3.0)[1] == 0                         # served past the cap: reset
