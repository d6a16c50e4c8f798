"""Who waits in what order, and who is shed from a full queue (pool/queue_order.py)."""
from pool.queue_order import Admission, Rank, admit


def test_room_left_admits_anyone():
    assert admit([Rank(0, 0)], Rank(100, 1), limit=2) == Admission(True)


def test_a_full_queue_sheds_the_worst_priority_latest_arrival_for_a_better_newcomer():
    waiting = [Rank(100, 0), Rank(0, 1), Rank(100, 2), Rank(5, 3)]
    assert admit(waiting, Rank(0, 4), limit=4) == Admission(True, shed=Rank(100, 2))
    assert admit(waiting, Rank(99, 4), limit=4) == Admission(True, shed=Rank(100, 2))


def test_a_newcomer_that_outranks_nobody_is_refused():
    waiting = [Rank(0, 0), Rank(100, 1)]
    assert admit(waiting, Rank(100, 2), limit=2) == Admission(False)     # equal: first come stays
    assert admit(waiting, Rank(200, 2), limit=2) == Admission(False)
    assert admit([], Rank(0, 0), limit=0) == Admission(False)


def test_ranks_order_by_priority_then_arrival():
    assert sorted([Rank(100, 0), Rank(0, 2), Rank(0, 1), Rank(-1, 9)]) == \
        [Rank(-1, 9), Rank(0, 1), Rank(0, 2), Rank(100, 0)]
