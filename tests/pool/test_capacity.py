"""Capacity's pure helpers (the books over a changing inventory are tested through
the manager in test_pool_units.py)."""
from pool.capacity import reserved_bytes, slot_changes
from pool.inventory import Slot
from pool.settings import GB


def test_slot_changes_by_slot_id():
    a, b, c = (Slot(f"n/{i}", "n", "cuda", GB, i) for i in range(3))
    assert slot_changes([a, b], [b, c]) == ([c], [a])
    assert slot_changes([a], [Slot("n/0", "n", "cuda", 2 * GB, 0)]) == ([], [])


def test_an_exclusive_slot_is_full_once_held_a_shared_one_by_its_bytes():
    ray_gpu = Slot("ray-n/gpu0", "n", "cuda", 8 * GB, 0, exclusive=True)
    local_gpu = Slot("local/cuda0", "local", "cuda", 8 * GB, 0)
    assert reserved_bytes(ray_gpu, {}) == 0
    assert reserved_bytes(ray_gpu, {"r1": GB}) == 8 * GB
    assert reserved_bytes(local_gpu, {"r1": GB, "r2": 2 * GB}) == 3 * GB


async def test_a_busy_revisions_replica_is_placed_apart_from_another_busy_one():
    """Capacity keeps each placed replica's expected load on its slots (pool/placement.py)."""
    from pool.placement import PlacementRequest
    from pool.settings import PoolSettings
    from pool.capacity import Capacity

    cap = Capacity(PoolSettings())
    await cap.update([Slot("n/0", "n", "cuda", 16 * GB, 0), Slot("n/1", "n", "cuda", 16 * GB, 1)])
    noop = lambda _why: None   # noqa: E731
    first = await cap.place("r1", "t", PlacementRequest(4 * GB, load=0.8), (), noop)
    second = await cap.place("r2", "t", PlacementRequest(4 * GB, load=0.8), (), noop)
    assert first.slot_ids != second.slot_ids
    assert sorted(s.load for s in cap.states()) == [0.8, 0.8]
    light = await cap.place("r3", "t", PlacementRequest(4 * GB), (), noop)
    assert light.slot_ids in (first.slot_ids, second.slot_ids)     # no load: best fit by memory
    await cap.release("r1", first.slot_ids)
    assert sorted(s.load for s in cap.states()) == [0.0, 0.8]


async def test_the_kind_of_a_replicas_slots_is_the_inventorys():
    """What a replica event names as its GPU kind: the slots' own; None once they left the
    pool, and for slots of several kinds (no placement makes such a replica)."""
    from pool.capacity import Capacity
    from pool.settings import PoolSettings

    cap = Capacity(PoolSettings())
    await cap.update([Slot("n/cuda0", "n", "cuda", GB, 0), Slot("n/cuda1", "n", "cuda", GB, 1),
                      Slot("n/cpu0", "n", "cpu", GB)])
    assert cap.kind_of(("n/cuda0", "n/cuda1")) == "cuda"
    assert cap.kind_of(("n/cpu0",)) == "cpu"
    assert cap.kind_of(("n/cuda0", "n/cpu0")) is None
    assert cap.kind_of(("gone/cuda0",)) is None
    await cap.update([Slot("m/cuda0", "m", "cuda", GB, 0, gpu_kind="h100"),
                      Slot("m/cuda1", "m", "cuda", GB, 1, gpu_kind="h100")])
    assert cap.kind_of(("m/cuda0", "m/cuda1")) == "h100"       # the GPU's type, for the cost book
