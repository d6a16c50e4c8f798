"""Small pure pieces of the pool: settings, inventory, flags, manager helpers."""
from datetime import datetime, timezone
from pathlib import Path

from pool.backends.local import engine_flags, runtime_has_standby
from pool.inventory import cpu_slots
from pool.manager import ReplicaSlot, cold_start_timings, failure_reason, scale_down_order
from pool.api import ColdStartFailed, RevisionSpec
from pool.replica import Replica, ReplicaState as S
from pool.settings import GB, PoolSettings

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPEC = RevisionSpec("rev", "dep", "ten", "s3://b/m/")


def test_settings_from_env_reads_once_and_types_values():
    s = PoolSettings.from_env({"THAWPOOL_CPU_SLOTS": "3", "THAWPOOL_SLOT_MEMORY_GB": "1.5",
                               "THAWPOOL_CACHE_DIR": "/tmp/x", "THAWPOOL_VERIFY_MD5": "false",
                               "THAWPOOL_S3_ENDPOINT": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k"},
                              warm_pool_size=0)
    assert (s.cpu_slots, s.slot_memory_gb, s.cache_dir, s.verify_md5) == (3, 1.5, Path("/tmp/x"), False)
    assert (s.s3_endpoint, s.aws_access_key_id, s.warm_pool_size) == ("http://127.0.0.1:9", "k", 0)
    assert s.part_size_bytes == 8 * 1024 * 1024


def test_declared_cpu_slots():
    slots = cpu_slots(PoolSettings(cpu_slots=2, slot_memory_gb=4, node="n"))
    assert [(s.slot_id, s.kind, s.memory_bytes) for s in slots] == [("n/cpu0", "cpu", 4 * GB), ("n/cpu1", "cpu", 4 * GB)]


def test_engine_kwargs_become_server_flags():
    assert engine_flags({"dtype": "bfloat16", "kv_cache_tokens": 512, "enable_prefix_caching": False,
                         "speculative": {"method": "ngram", "k": 4}}) == [
        "--dtype", "bfloat16", "--kv-cache-tokens", "512", "--no-enable-prefix-caching",
        "--speculative", '{"method": "ngram", "k": 4}']


def test_runtime_in_this_tree_has_standby_mode():
    assert runtime_has_standby()


def slot(rid, t, *path, in_flight=0, placed=True):
    r = Replica(rid, "rev", t, T0)
    for i, state in enumerate(path):
        r.move(state, t + i + 1, T0)
    s = ReplicaSlot(r, SPEC, in_flight=in_flight)
    s.placed = object() if placed else None
    return s


def test_scale_down_prefers_unplaced_then_starting_then_least_loaded():
    ready_busy = slot("busy", 0, S.PULLING, S.LOADING, S.READY, in_flight=3)
    ready_idle = slot("idle", 1, S.PULLING, S.LOADING, S.READY, in_flight=0)
    loading = slot("loading", 2, S.PULLING, S.LOADING)
    unplaced = slot("unplaced", 3, placed=False)
    order = [s.replica_id for s in scale_down_order([ready_busy, ready_idle, loading, unplaced])]
    assert order == ["unplaced", "loading", "idle", "busy"]


def test_cold_start_timings_come_from_transitions():
    r = Replica("r", "rev", 10.0, T0)
    for t, state in [(10.5, S.PULLING), (13.0, S.LOADING), (14.0, S.READY)]:
        r.move(state, t, T0)
    cs = cold_start_timings(r, queue_s=4.2)
    assert (cs.queue_s, cs.placement_s, cs.download_s, cs.load_s, cs.total_s) == (4.2, 0.5, 2.5, 1.0, 4.0)


def test_failure_reasons_are_readable():
    assert failure_reason(ColdStartFailed("missing object s3://b/k")) == "missing object s3://b/k"
    assert failure_reason(RuntimeError("boom")) == "RuntimeError: boom"


def test_crash_backoff_doubles_and_a_first_crash_after_serving_is_replaced_at_once():
    from pool.activator import RevisionQueue
    from pool.desired import EventLog, InMemoryDesiredState
    from pool.manager import PoolManager, RevisionState

    manager = PoolManager(PoolSettings(crash_backoff_base_s=1, crash_backoff_cap_s=8),
                          InMemoryDesiredState(), EventLog())
    rev = RevisionState(SPEC, RevisionQueue("rev", 4))
    never_ready = slot("a", 0, S.PULLING)
    assert [manager._note_failure(rev, never_ready, False, 10.0) for _ in range(5)] == [1, 2, 4, 8, 8]
    rev = RevisionState(SPEC, RevisionQueue("rev", 4))
    served = slot("b", 0, S.PULLING, S.LOADING, S.READY)            # ready at t=3
    assert manager._note_failure(rev, served, True, 5.0) == 0        # first crash: replace now
    assert manager._note_failure(rev, served, True, 6.0) == 1        # repeated: back off
    assert manager._note_failure(rev, served, True, 7.0) == 2
    assert manager._note_failure(rev, served, True, 3.0 + 8) == 0    # served past the cap: reset


# -- backend selection and a cluster's changing inventory ---------------------

def test_backend_settings_from_env_and_validation():
    import pytest

    s = PoolSettings.from_env({"THAWPOOL_BACKEND": "ray", "THAWPOOL_RAY_ADDRESS": "10.0.0.5:6379",
                               "THAWPOOL_RAY_REPLICA_HOST": "0.0.0.0", "THAWPOOL_RAY_GPU_MEMORY_GB": "80"})
    assert (s.backend, s.ray_address, s.ray_replica_host, s.ray_gpu_memory_gb) == (
        "ray", "10.0.0.5:6379", "0.0.0.0", 80.0)
    default = PoolSettings.from_env({"THAWPOOL_RAY_ADDRESS": ""})
    assert (default.backend, default.ray_address, default.ray_gpu_memory_gb) == ("local", None, None)
    with pytest.raises(ValueError, match="backend must be one of local, ray"):
        PoolSettings(backend="k8s")


def test_build_backend_picks_local_by_default():
    from pool.backends import build_backend
    from pool.backends.local import LocalBackend

    assert isinstance(build_backend(PoolSettings()), LocalBackend)


def test_build_backend_ray_reads_its_settings():
    import pytest

    pytest.importorskip("ray", reason="ray not installed")
    from pool.backends import build_backend
    from pool.backends.ray import RayBackend

    backend = build_backend(PoolSettings(backend="ray", ray_address="127.0.0.1:1", slot_memory_gb=3,
                                         ray_replica_host="0.0.0.0"))
    assert isinstance(backend, RayBackend) and backend.pulls_on_node
    assert (backend.address, backend.gpu_memory_bytes, backend.bind_host) == ("127.0.0.1:1", 3 * GB, "0.0.0.0")
    sized = build_backend(PoolSettings(backend="ray", ray_gpu_memory_gb=80))
    assert sized.gpu_memory_bytes == 80 * GB


def test_slot_changes_by_slot_id():
    from pool.inventory import Slot
    from pool.manager import slot_changes

    a, b, c = (Slot(f"n/{i}", "n", "cuda", GB, i) for i in range(3))
    assert slot_changes([a, b], [b, c]) == ([c], [a])
    assert slot_changes([a], [Slot("n/0", "n", "cuda", 2 * GB, 0)]) == ([], [])


class ChangingInventory:
    """A cluster backend stand-in: inventory() answers whatever `slots` holds now."""

    def __init__(self, slots):
        self.slots = slots

    async def inventory(self):
        return list(self.slots)


async def test_inventory_refresh_adds_and_drops_slots_and_wakes_waiters():
    import asyncio

    import pytest

    from pool.desired import EventLog, InMemoryDesiredState
    from pool.inventory import Slot
    from pool.manager import PoolManager
    from pool.placement import Placed

    node_a = [Slot(f"a/gpu{i}", "a", "cuda", GB, i) for i in range(2)]
    node_b = [Slot(f"b/gpu{i}", "b", "cuda", GB, i) for i in range(2)]
    backend = ChangingInventory(node_a)
    manager = PoolManager(PoolSettings(), InMemoryDesiredState(), EventLog(), backend=backend)
    await manager.refresh_inventory()
    assert [s.slot_id for s in manager.slots] == ["a/gpu0", "a/gpu1"]
    held = slot("r", 0, S.PULLING)
    manager._reserve(held, Placed("a", ("a/gpu1",), GB))

    async def woken() -> bool:
        async with manager._capacity:
            await manager._capacity.wait()
        return True

    waiter = asyncio.ensure_future(woken())
    await asyncio.sleep(0)
    backend.slots = node_b                      # a left, b joined
    await manager.refresh_inventory()
    assert await asyncio.wait_for(waiter, 5)
    assert [s.slot_id for s in manager.slots] == ["b/gpu0", "b/gpu1"]
    assert [(s.slot_id, s.reserved_bytes) for s in manager._slot_states()] == [("b/gpu0", 0), ("b/gpu1", 0)]
    await manager._unreserve(held)              # the replica of the gone node lets go: no error
    assert held.placed is None
    late = slot("late", 0)
    late.replica.slot_ids = ("a/gpu0",)          # placed on a before it left
    with pytest.raises(ColdStartFailed, match="a/gpu0 left the pool"):
        manager._placed_slots(late)


def test_an_exclusive_slot_is_full_once_held_a_shared_one_by_its_bytes():
    from pool.inventory import Slot
    from pool.manager import reserved_bytes

    ray_gpu = Slot("ray-n/gpu0", "n", "cuda", 8 * GB, 0, exclusive=True)
    local_gpu = Slot("local/cuda0", "local", "cuda", 8 * GB, 0)
    assert reserved_bytes(ray_gpu, {}) == 0
    assert reserved_bytes(ray_gpu, {"r1": GB}) == 8 * GB
    assert reserved_bytes(local_gpu, {"r1": GB, "r2": 2 * GB}) == 3 * GB


def test_a_replica_being_stopped_is_not_failed_by_its_dead_handle():
    from pool.activator import RevisionQueue
    from pool.desired import EventLog, InMemoryDesiredState
    from pool.manager import PoolManager, RevisionState

    manager = PoolManager(PoolSettings(), InMemoryDesiredState(), EventLog())
    rev = RevisionState(SPEC, RevisionQueue("rev", 4))
    draining = slot("d", 0, S.PULLING, S.LOADING, S.READY, S.DRAINING)
    draining.stopping = True
    rev.replicas["d"] = draining
    manager._fail(rev, draining, "stopped")
    assert (draining.state, rev.failures, rev.last_error) == (S.DRAINING, 0, None)
