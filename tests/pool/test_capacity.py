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
