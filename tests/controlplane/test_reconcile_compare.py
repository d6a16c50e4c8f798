"""controlplane.billing.reconcile.compare: each replica's own counters against its bill, over
plain data (no database)."""
from controlplane.billing.reconcile import ReplicaCount, Tokens, compare, render


def count(replica_id: str, served: Tokens | None, final: bool) -> ReplicaCount:
    return ReplicaCount(replica_id, "rev-1", "tenant-1", served, final)


def test_final_counters_must_equal_the_bill_to_the_token():
    result = compare([count("a", Tokens(10, 20), True), count("b", Tokens(10, 20), True)],
                     {"a": Tokens(10, 20), "b": Tokens(10, 19)})
    assert (result.exact, result.ok) == (1, False)
    assert [(d.replica_id, d.billed) for d in result.drift] == [("b", Tokens(10, 19))]
    assert "DRIFT replica b revision rev-1: served 10+20 billed 10+19" in render(result)


def test_more_billed_than_final_counters_is_drift_too():
    result = compare([count("a", Tokens(10, 20), True)], {"a": Tokens(11, 20)})
    assert [d.why for d in result.drift] == ["billed differs from the replica's final counters"]


def test_a_last_report_is_a_floor_the_bill_must_reach():
    counts = [count("live", Tokens(5, 5), False), count("killed", Tokens(5, 5), False)]
    result = compare(counts, {"live": Tokens(9, 30), "killed": Tokens(5, 4)})
    assert result.at_least == 1
    assert [(d.replica_id, d.why) for d in result.drift] == [
        ("killed", "billed less than the replica had served at its last report")]


def test_a_replica_that_never_reported_is_counted_apart_and_not_drift():
    result = compare([count("quiet", None, False)], {"quiet": Tokens(3, 3)})
    assert (result.unreported, result.ok) == (1, True)


def test_a_replica_with_nothing_billed_and_nothing_served_is_exact():
    result = compare([count("idle", Tokens(0, 0), True)], {})
    assert (result.exact, result.ok) == (1, True)


def test_rows_for_a_replica_without_a_lifetime_are_drift():
    result = compare([], {"ghost": Tokens(1, 2)})
    assert [(d.replica_id, d.revision_id, d.why) for d in result.drift] == [
        ("ghost", None, "billed for a replica with no lifetime")]
    assert render(result).startswith("replicas: 0 exact, 0 billed at least their last report, "
                                     "0 never reported, 0 with calls cut by a control-plane restart; drift: 1")


def test_calls_cut_by_a_control_plane_death_explain_a_bill_below_the_counters():
    """Tokens the replica generated after the dead gateway's last delivery: CUT, not drift."""
    result = compare([count("adopted", Tokens(40, 90), True)], {"adopted": Tokens(40, 87)}, {"adopted": 3})
    assert (result.ok, result.exact) == (True, 0)
    assert [(c.replica_id, c.served, c.billed, c.calls) for c in result.cut] == [
        ("adopted", Tokens(40, 90), Tokens(40, 87), 3)]
    assert "CUT replica adopted: served 40+90 billed 40+87 (prompt+completion): 3 calls cut" in render(result)


def test_cut_calls_never_excuse_a_bill_above_the_counters():
    result = compare([count("adopted", Tokens(40, 90), True)], {"adopted": Tokens(40, 91)}, {"adopted": 3})
    assert not result.ok and not result.cut
    assert [d.why for d in result.drift] == ["billed differs from the replica's final counters"]


def test_a_replica_without_cut_calls_gets_no_such_excuse():
    result = compare([count("a", Tokens(40, 90), True)], {"a": Tokens(40, 87)}, {"b": 1})
    assert not result.ok and not result.cut
