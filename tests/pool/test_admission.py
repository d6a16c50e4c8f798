"""Who gets freed slots: fairness across tenants and GPU quotas, as a pure decision."""
from pool.admission import Pending, WaitReason, admit, fair_order, never_within_quota, queue_refusal
from pool.api import TenantQuota
from pool.placement import GB, Placed, PlacementRequest, SlotState

ONE = PlacementRequest(GB)                       # one slot, a whole 1 GiB slot
TWO = PlacementRequest(GB, slot_count=2)


def gpus(n: int, node: str = "n", used: int = 0) -> list[SlotState]:
    """n exclusive 1 GiB GPUs on one node, the first `used` of them held."""
    return [SlotState(f"{node}/g{i}", node, GB, GB if i < used else 0, exclusive=True) for i in range(n)]


def pending(*specs: tuple[str, str], request: PlacementRequest = ONE) -> list[Pending]:
    """(replica_id, tenant) in arrival order."""
    return [Pending(rid, tenant, request, seq) for seq, (rid, tenant) in enumerate(specs)]


def placed_ids(decision) -> list[str]:
    return [rid for rid, _ in decision.placed]


def test_freed_slots_go_to_tenants_in_turn_not_to_the_first_burst():
    burst = pending(("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B"), ("c1", "C"))
    decision = admit(burst, gpus(4), held={}, quotas={})
    assert placed_ids(decision) == ["a1", "b1", "c1", "a2"]
    assert set(decision.waiting) == {"a3", "b2"}
    assert all("waiting for capacity" in w.reason and not w.over_quota for w in decision.waiting.values())


def test_the_tenant_holding_fewest_gpus_goes_first_even_if_it_came_later():
    decision = admit(pending(("a1", "A"), ("b1", "B")), gpus(3, used=2), held={"A": 2}, quotas={})
    assert decision.placed == (("b1", Placed("n", ("n/g2",), GB)),)
    assert list(decision.waiting) == ["a1"]


def test_same_holdings_oldest_first():
    order = fair_order(pending(("a1", "A"), ("b1", "B"), ("a2", "A")), held={"A": 1, "B": 1})
    assert [p.replica_id for p in order] == ["a1", "b1", "a2"]


def test_a_tenant_at_its_gpu_quota_waits_and_takes_nobody_elses_gpu():
    quotas = {"A": TenantQuota(max_gpus=2)}
    decision = admit(pending(("a3", "A"), ("b1", "B")), gpus(4, used=2), held={"A": 2}, quotas=quotas)
    assert placed_ids(decision) == ["b1"]                 # a free GPU stays free rather than go past A's quota
    assert decision.waiting == {"a3": WaitReason("waiting for GPU quota: tenant A holds 2 of its 2 GPU(s) "
                                              "and this replica needs 1", over_quota=True)}


def test_quota_counts_what_this_round_granted_and_multi_gpu_replicas_whole():
    quotas = {"A": TenantQuota(max_gpus=3)}
    decision = admit(pending(("a1", "A"), ("a2", "A"), request=TWO), gpus(4), held={}, quotas=quotas)
    assert placed_ids(decision) == ["a1"]
    assert decision.waiting["a2"].over_quota            # 2 held + 2 more > 3


def test_a_replica_too_big_for_the_free_slots_is_passed_over_by_one_that_fits():
    waiting_big = Pending("a-tp", "A", TWO, 0)
    small = Pending("b1", "B", ONE, 1)
    decision = admit([waiting_big, small], gpus(2, used=1), held={"C": 1}, quotas={})
    assert placed_ids(decision) == ["b1"]
    assert not decision.waiting["a-tp"].over_quota


def test_shared_slots_fill_by_memory_and_nothing_placed_twice():
    half = PlacementRequest(GB // 2)
    slot = [SlotState("n/cpu0", "n", GB)]
    decision = admit(pending(("a1", "A"), ("b1", "B"), ("a2", "A"), request=half), slot, held={}, quotas={})
    assert placed_ids(decision) == ["a1", "b1"]
    assert list(decision.waiting) == ["a2"]


def test_quota_limits_that_can_never_be_met_and_queued_requests():
    assert never_within_quota(2, TenantQuota(max_gpus=1)) == "needs 2 GPU(s); the tenant's quota is 1"
    assert never_within_quota(2, TenantQuota()) is None
    assert queue_refusal("A", 3, TenantQuota(max_queued_requests=4)) is None
    assert queue_refusal("A", 4, TenantQuota(max_queued_requests=4)) == \
        "tenant A: 4 requests already wait for replicas (quota 4)"
    assert queue_refusal("A", 10_000, TenantQuota()) is None
