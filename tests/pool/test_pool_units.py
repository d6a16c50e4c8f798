"""Small pure pieces of the pool: settings, inventory, flags, manager helpers."""
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Optional, Sequence

from pool.api import ColdStartFailed, RevisionSpec
from pool.adoption import Registration
from pool.backends.base import ReplicaHandle, Survivor
from pool.backends.runtime_args import engine_flags, engine_for
from pool.cold_start import cold_start_timings, failure_reason
from pool.inventory import Slot, cpu_slots
from pool.launch import ReplicaLaunch
from pool.registry import ManagedReplica, scale_down_order
from pool.replica import Replica, ReplicaState
from pool.settings import GB, PoolSettings
from spec.engine_options import ChosenOptions

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPEC = RevisionSpec("rev", "dep", "ten", "s3://b/m/")
PULLING, LOADING, READY, DRAINING = (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY,
                                     ReplicaState.DRAINING)


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
    assert [(s.slot_id, s.kind, s.memory_bytes) for s in slots] == \
        [("n/cpu0", "cpu", 4 * GB), ("n/cpu1", "cpu", 4 * GB)]


def test_engine_kwargs_become_server_flags():
    assert engine_flags({"dtype": "bfloat16", "kv_cache_tokens": 512, "enable_prefix_caching": False,
                         "speculative": {"method": "ngram", "k": 4}}) == [
        "--dtype", "bfloat16", "--kv-cache-tokens", "512", "--no-enable-prefix-caching",
        "--speculative", '{"method": "ngram", "k": 4}']


def test_one_engine_for_both_backends():
    """A local process names its one GPU; a Ray actor (isolated: it sees only its own
    GPUs) and a multi-GPU local replica (CUDA_VISIBLE_DEVICES narrowed) say plain cuda."""
    one, two = [Slot("n/cuda3", "n", "cuda", GB, 3)], [Slot(f"n/cuda{i}", "n", "cuda", GB, i) for i in (1, 2)]
    spec = RevisionSpec("rev", "dep", "ten", "s3://b/m/", engine=ChosenOptions({"dtype": "float16"}))
    assert engine_for(spec, one, 64, isolated=False) == {"dtype": "float16", "kv_cache_tokens": 64,
                                                         "device": "cuda:3"}
    assert engine_for(spec, one, 64, isolated=True)["device"] == "cuda"
    assert engine_for(spec, two, 64, isolated=False) == {"dtype": "float16", "kv_cache_tokens": 64,
                                                         "device": "cuda", "tensor_parallel_size": 2}
    pinned = RevisionSpec("rev", "dep", "ten", "s3://b/m/",
                          engine=ChosenOptions({"device": "cpu", "kv_cache_tokens": 8}))
    assert engine_for(pinned, one, 64, isolated=False) == {"device": "cpu", "kv_cache_tokens": 8}


def test_cpu_replicas_are_given_the_nodes_packed_layer_cache():
    packed = (PoolSettings(cache_dir=Path("/c")).packed_dir, 4.0)
    cpu, cuda = cpu_slots(PoolSettings(cpu_slots=1))[:1], [Slot("n/cuda0", "n", "cuda", GB, 0)]
    assert engine_for(SPEC, cpu, 64, isolated=False, packed=packed) == {
        "kv_cache_tokens": 64, "packed_cache_dir": "/c/packed", "packed_cache_gb": 4.0}
    assert "packed_cache_dir" not in engine_for(SPEC, cuda, 64, isolated=False, packed=packed)
    assert "packed_cache_dir" not in engine_for(SPEC, cpu, 64, isolated=False, packed=(Path("/c"), 0.0))


def test_the_cold_start_builds_one_launch_and_leaves_the_node_what_only_it_knows():
    from dataclasses import replace

    from pool.api import TenantQuota
    from pool.cold_start import launch_for
    from pool.launch import Confinement, FunctionServer, ModelServer

    class Here:
        pulls_on_node, isolates_gpus = False, False

    settings = PoolSettings(cache_dir=Path("/c"), runtime_python="/py", runtime_threads=2, packed_cache_gb=4.0,
                            kv_cache_tokens_default=256)
    cpu, cuda = cpu_slots(PoolSettings(cpu_slots=1))[:1], [Slot("n/cuda1", "n", "cuda", GB, 1)]
    model = launch_for(SPEC, cuda, settings, Here(), folder=Path("/m"))         # type: ignore[arg-type]
    assert model.program == ModelServer(SPEC.revision_id, {"kv_cache_tokens": 256, "device": "cuda:1"})
    assert (model.interpreter, model.folder, model.kind, model.takes_standby) == ("/py", Path("/m"), "model", True)
    assert model.env["OMP_NUM_THREADS"] == "2" and "THAWPOOL_REPLICA_SECRET" not in model.env
    assert model.sandbox == Confinement(SPEC.tenant_id, None)
    assert model.visible_gpus([1]) == [] and model.visible_gpus([1, 2]) == [1, 2]   # one GPU: named by index

    on_node = launch_for(SPEC, cuda, settings, FakeBackend([]), folder=None)
    assert (on_node.interpreter, on_node.folder) == (None, None)                   # the node names both
    assert isinstance(on_node.program, ModelServer) and on_node.program.engine["device"] == "cuda"
    assert "packed_cache_dir" in launch_for(SPEC, cpu, settings, Here(), folder=Path("/m")).program.engine
    assert "packed_cache_dir" not in launch_for(SPEC, cpu, settings, FakeBackend([]), folder=None).program.engine

    granted = replace(SPEC, kind="function", quota=TenantQuota(egress=("api.example:443",)))
    function = launch_for(granted, cpu, settings, Here(), folder=Path("/p"), venv="/venv/bin/python")
    assert function.program == FunctionServer(SPEC.revision_id, 3072 + 1024)
    assert (function.interpreter, function.takes_standby, function.clean_env) == ("/venv/bin/python", False, True)
    assert function.sandbox == Confinement(SPEC.tenant_id, 3072 + 1024, ("api.example:443",))
    assert function.visible_gpus([1]) == [1]                                       # its handler says "cuda"
    assert launch_for(granted, cpu, settings.with_(sandbox="off"), Here(), folder=Path("/p")).sandbox is None


def test_each_replica_gets_its_secret_in_its_environment_and_sends_it_as_a_bearer_header():
    from pool.backends.runtime_args import auth_headers, new_secret, runtime_env
    from wire.replica_secret import SECRET_ENV

    one, two = new_secret(), new_secret()
    assert one != two and len(one) >= 40
    env = runtime_env(2, one)
    assert env[SECRET_ENV] == one and env["OMP_NUM_THREADS"] == "2"
    assert auth_headers(one) == {"Authorization": f"Bearer {one}"}


def test_a_draft_model_is_a_uri_and_the_runtime_gets_its_local_folder():
    import pytest

    from pool.api import ModelUnavailable
    from pool.backends.runtime_args import draft_model_uri, with_draft_folder

    draft = ChosenOptions({"speculative": {"method": "draft", "model": "s3://models/ten/draft/", "k": 4},
                           "dtype": "float32"})
    assert draft_model_uri(draft) == "s3://models/ten/draft/"
    assert draft_model_uri({"speculative": {"method": "ngram", "k": 4}}) is None
    assert draft_model_uri({}) is None
    assert with_draft_folder(draft, "/cache/models/abc") == {
        "speculative": {"method": "draft", "model": "/cache/models/abc", "k": 4}, "dtype": "float32"}
    assert draft["speculative"]["model"] == "s3://models/ten/draft/"          # not changed in place
    for bad in ("/home/other-tenant/model", "s3:///no-bucket", None, 7):
        with pytest.raises(ModelUnavailable, match="engine.speculative.model: the draft model must be a model URI"):
            draft_model_uri({"speculative": {"method": "draft", "model": bad}})


def managed(rid, t, *path, in_flight=0, placed=True):
    r = Replica(rid, "rev", t, T0)
    for i, state in enumerate(path):
        r.move(state, t + i + 1, T0)
    m = ManagedReplica(r, SPEC, in_flight=in_flight)
    m.placed = object() if placed else None
    return m


def test_scale_down_prefers_unplaced_then_starting_then_least_loaded():
    ready_busy = managed("busy", 0, PULLING, LOADING, READY, in_flight=3)
    ready_idle = managed("idle", 1, PULLING, LOADING, READY, in_flight=0)
    loading = managed("loading", 2, PULLING, LOADING)
    unplaced = managed("unplaced", 3, placed=False)
    order = [m.replica_id for m in scale_down_order([ready_busy, ready_idle, loading, unplaced])]
    assert order == ["unplaced", "loading", "idle", "busy"]


def test_cold_start_timings_come_from_transitions():
    r = Replica("r", "rev", 10.0, T0)
    for t, state in [(10.5, PULLING), (13.0, LOADING), (14.0, READY)]:
        r.move(state, t, T0)
    cs = cold_start_timings(r, queue_s=4.2)
    assert (cs.queue_s, cs.placement_s, cs.download_s, cs.load_s, cs.total_s) == (4.2, 0.5, 2.5, 1.0, 4.0)


def test_failure_reasons_are_readable():
    assert failure_reason(ColdStartFailed("missing object s3://b/k")) == "missing object s3://b/k"
    assert failure_reason(RuntimeError("boom")) == "RuntimeError: boom"


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


async def test_local_backend_lists_this_machines_slots_and_prefers_no_node(tmp_path):
    from pool.backends.local import LocalBackend

    backend = LocalBackend(PoolSettings(accelerator="cpu", cpu_slots=2, slot_memory_gb=1, node="n",
                                        cache_dir=tmp_path, warm_pool_size=0))
    try:
        slots = await backend.inventory()
        assert [(s.slot_id, s.memory_bytes) for s in slots] == [("n/cpu0", GB), ("n/cpu1", GB)]
        slots.clear()                              # a copy: callers cannot change the backend's slots
        assert len(await backend.inventory()) == 2
        assert backend.pulls_on_node is False and await backend.nodes_holding(["some-key"]) == set()
    finally:
        await backend.close()


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


class FakeBackend:
    """A whole Backend (pool.backends.base) that starts nothing: inventory() answers
    whatever `slots` holds now, as a cluster's would while nodes come and go."""
    pulls_on_node = True
    isolates_gpus = True
    can_sleep = False

    def __init__(self, slots: Sequence[Slot]):
        self.slots = list(slots)
        self.forgotten: list[str] = []
        self.expected: list[str] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def inventory(self) -> list[Slot]:
        return list(self.slots)

    async def nodes_holding(self, keys: Iterable[str]) -> set[str]:
        return set()

    async def start_replica(self, spec: RevisionSpec, launch: ReplicaLaunch, slots: Sequence[Slot],
                            replica_id: str, *, registration: Optional[Registration] = None) -> ReplicaHandle:
        raise RuntimeError("FakeBackend starts no replicas")

    async def survivors(self) -> list[Survivor]:
        return []

    def expect(self, revision_ids: Sequence[str]) -> None:
        self.expected = list(revision_ids)

    def forget(self, handle: ReplicaHandle) -> None:
        self.forgotten.append(handle.replica_id)


async def test_inventory_refresh_adds_and_drops_slots_and_places_who_waits():
    import asyncio

    import pytest

    from pool.in_memory import EventLog, InMemoryDesiredState
    from pool.manager import PoolManager
    from pool.placement import Placed, PlacementRequest
    from pool.stopping import ReplicaStopper

    node_a = [Slot(f"a/gpu{i}", "a", "cuda", GB, i) for i in range(2)]
    node_b = [Slot(f"b/gpu{i}", "b", "cuda", GB, i) for i in range(2)]
    backend = FakeBackend(node_a)
    manager = PoolManager(PoolSettings(), InMemoryDesiredState(), EventLog(), backend=backend)
    await manager.refresh_inventory()
    assert [s.slot_id for s in manager.slots] == ["a/gpu0", "a/gpu1"]
    capacity, why = manager.capacity, []
    held = managed("r", 0, PULLING)
    held.placed = await capacity.place("r", "ten", PlacementRequest(GB), (), why.append)
    assert held.placed == Placed("a", ("a/gpu0",), GB)
    assert [(s.slot_id, s.reserved_bytes) for s in capacity.states()] == [("a/gpu0", GB), ("a/gpu1", 0)]
    assert capacity.gpus_held() == {"ten": 1}

    big = asyncio.ensure_future(capacity.place("big", "ten", PlacementRequest(GB, slot_count=2), (), why.append))
    await asyncio.sleep(0)
    assert not big.done() and "waiting for capacity" in why[-1].reason
    backend.slots = node_b                      # a left, b joined
    await manager.refresh_inventory()
    assert await asyncio.wait_for(big, 5) == Placed("b", ("b/gpu0", "b/gpu1"), GB)   # placed by the join
    assert [s.slot_id for s in manager.slots] == ["b/gpu0", "b/gpu1"]
    assert [(s.slot_id, s.reserved_bytes) for s in capacity.states()] == [("b/gpu0", GB), ("b/gpu1", GB)]
    stopper = ReplicaStopper(backend, capacity, manager._events, weights=None, http=None, stop_timeout_s=1.0)
    await stopper.cleanup(held)                 # the replica of the gone node lets go: no error
    assert held.placed is None and capacity.gpus_held() == {"ten": 2}
    with pytest.raises(ColdStartFailed, match="a/gpu0 left the pool"):
        capacity.slots_for(("a/gpu0",))          # a replica placed on a before it left


async def test_capacity_places_waiting_replicas_fairly_when_slots_free_and_quotas_change():
    """The books under pool.admission: a release or a raised quota places who waits, in the
    fair order; a wait that is cancelled gives back what it was granted."""
    import asyncio

    from pool.api import TenantQuota
    from pool.capacity import Capacity
    from pool.placement import PlacementRequest

    capacity = Capacity(PoolSettings())
    await capacity.update([Slot(f"n/gpu{i}", "n", "cuda", GB, i, exclusive=True) for i in range(2)])
    capacity.set_quotas({"A": TenantQuota(max_gpus=1)})
    one, why = PlacementRequest(GB), {}

    def ask(rid: str, tenant: str) -> asyncio.Future:
        return asyncio.ensure_future(capacity.place(rid, tenant, one, (), lambda w: why.__setitem__(rid, w)))
    a1, a2, b1, b2 = ask("a1", "A"), ask("a2", "A"), ask("b1", "B"), ask("b2", "B")
    await asyncio.sleep(0)
    assert [f.done() for f in (a1, a2, b1, b2)] == [True, False, True, False]
    assert why["a2"].over_quota and not why["b2"].over_quota
    capacity.set_quotas({"A": TenantQuota(max_gpus=2)})   # A may grow, but no slot is free
    assert not a2.done() and not why["a2"].over_quota
    await capacity.release("b1", b1.result().slot_ids)    # B now holds none, A one: b2 before a2
    await asyncio.sleep(0)
    assert (b2.done(), a2.done()) == (True, False)
    await capacity.release("a1", a1.result().slot_ids)    # a2 is granted the slot...
    a2.cancel()                                           # ...as its wait is cancelled
    await asyncio.gather(a2, return_exceptions=True)
    assert a2.cancelled() and capacity.gpus_held() == {"B": 1}
    assert [s.reserved_bytes for s in capacity.states()] == [0, GB]


def test_a_replica_being_stopped_is_not_failed_by_its_dead_handle():
    from pool.activator import RevisionQueue
    from pool.failures import ReplicaFailures
    from pool.in_memory import EventLog, InMemoryDesiredState
    from pool.manager import PoolManager
    from pool.registry import RevisionState

    manager = PoolManager(PoolSettings(), InMemoryDesiredState(), EventLog(), backend=FakeBackend([]))
    rev = RevisionState(SPEC, RevisionQueue("rev", 4))
    draining = managed("d", 0, PULLING, LOADING, READY, DRAINING)
    draining.stopping = True
    rev.replicas["d"] = draining
    failures = ReplicaFailures(manager._events, manager.clock, manager._backoff, stopper=None,
                               http=None, spawn=None)   # none is reached: nothing fails
    failures.fail(rev, draining, "stopped")
    assert (draining.state, rev.backoff.failures, rev.last_error) == (DRAINING, 0, None)
