"""Ray backend: every replica is a Ray actor holding its GPUs on some node.

The pool's placement picks slots from `inventory()` (one Slot per GPU of
each alive Ray node, `node` = the Ray node id); the backend then pins the
actor to that node: a one-GPU replica with hard node affinity, a multi-GPU
(tensor-parallel) replica through a STRICT_PACK placement group, so its
GPUs are reserved together on one node or not at all. The actor starts the
cold start's `ReplicaLaunch` (pool/launch.py) on its node (backends/ray_actor.py)
and reports its base_url; the pool then talks to it over HTTP exactly as to a
local one.

What the launch leaves to the node, the node fills in (`_on_node`): its own pull
of the revision into its own cache, a draft model's too; its own interpreter;
for a function, the package's venv, built (or found) under that cache as the
local backend's pool does on its machine (pool/function_env.py, timed as the
replica's `env_s`); its port.

A replica is dead when its runtime process exits or its actor dies (ray.kill,
or its node is lost: Ray fails every actor of a dead node). A watch task per
replica awaits that and keeps the reason for `exit_reason()`.

Replica actors (and a multi-GPU replica's placement group) are detached and
named (`replica-<id>` in `settings.ray_namespace`): they outlive the pool's
driver, and keep their replica's record. The next pool lists the namespace's
named actors (`survivors()`), adopts or stops those that still run, and kills
those whose runtime process has exited. One pool per namespace.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

from pool import function_env
from pool.adoption import Registration, ReplicaRecord, record_for
from pool.api import ColdStartFailed, Pins, RevisionSpec
from pool.backends.base import ReplicaHandle, Survivor
from pool.backends.ray_actor import ReplicaActor, cache_entries, node_cache_dir
from pool.backends.runtime_args import auth_headers, draft_model_uri, new_secret, with_draft_folder
from pool.launch import FunctionServer, ModelServer, ReplicaLaunch
from pool.inventory import Slot
from pool.settings import GB, PoolSettings

log = logging.getLogger(__name__)
ACTOR_PREFIX = "replica-"  # named actors of the pool's namespace that are replicas
ACTOR_THREADS = 4          # wait_exit blocks one thread (for WAIT_SLICE_S at most); stop/log_tail need others
WAIT_SLICE_S = 30.0
PROBE_TIMEOUT_S = 5.0      # a node slower to list its cache is answered from what it last said
RAY_ACCELERATOR_PREFIX = "accelerator_type:"   # the resource Ray adds for a node's detected GPU type


@dataclass
class RayReplica:
    replica_id: str
    base_url: str
    node_id: str
    gpu_ids: tuple[str, ...]
    pid: int                       # of the runtime process, on node_id
    actor: Any
    secret: str = field(repr=False)
    group: Optional[PlacementGroup] = None
    reason: Optional[str] = None
    watch: Optional[asyncio.Task[None]] = field(default=None, repr=False)
    env_s: float = 0.0             # a function's venv, built on the node by start_replica
    # none: the replica's node may be another machine than the pool's cache; adapters
    # go as PUT bodies
    adapter_inbox: Optional[Path] = None

    @property
    def headers(self) -> Mapping[str, str]:
        return auth_headers(self.secret)

    def is_alive(self) -> bool:
        return self.reason is None

    def exit_reason(self) -> Optional[str]:
        return self.reason

    async def stop(self, timeout_s: float) -> None:
        """Stop the runtime process, then the actor, then free its placement group."""
        if self.reason is None:
            self.reason = "stopped"
        await stop_children(self.actor, timeout_s)
        release(self.actor, self.group)
        if self.watch is not None:
            self.watch.cancel()
            await asyncio.gather(self.watch, return_exceptions=True)

    async def cached(self, default_cache_dir: Path) -> list[str]:
        """Weight-cache keys held by this replica's node."""
        keys: list[str] = await ref_result(self.actor.cached.remote(str(default_cache_dir)), 30)
        return keys


class RayBackend:
    # Each node pulls a revision's weights into its own cache (ReplicaActor.model_folder):
    # the pool skips its local fetch, and its launch names no folder.
    pulls_on_node = True
    isolates_gpus = True             # Ray sets an actor's CUDA_VISIBLE_DEVICES to its GPUs
    can_sleep = False                # an actor holds its num_gpus until it ends

    def __init__(self, settings: PoolSettings, address: Optional[str] = None,
                 gpu_memory_gb: Optional[float] = None, bind_host: Optional[str] = None):
        self.settings = settings
        self.address = address or settings.ray_address
        memory_gb = gpu_memory_gb or settings.ray_gpu_memory_gb or settings.slot_memory_gb
        self.gpu_memory_bytes = int(memory_gb * GB)
        self.bind_host = bind_host or settings.ray_replica_host
        self.namespace = settings.ray_namespace
        self.replicas: dict[str, RayReplica] = {}
        self._node_keys: dict[str, set[str]] = {}     # what each node's cache held when last seen
        self._owns_ray = False
        self._actor_class = ray.remote(ReplicaActor)
        self._probe = ray.remote(num_cpus=0)(node_cache_keys)

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        if not ray.is_initialized():        # tests and embedders may have connected already
            with embedders_signal_handlers():
                ray.init(address=self.address, namespace=self.namespace, log_to_driver=False)
            self._owns_ray = True

    async def close(self) -> None:
        timeout = self.settings.stop_timeout_s
        await asyncio.gather(*(r.stop(timeout) for r in self.replicas.values()), return_exceptions=True)
        self.replicas.clear()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def expect(self, revision_ids: Sequence[str]) -> None:
        """No warm standbys here: an actor starts for its replica."""

    def forget(self, handle: ReplicaHandle) -> None:
        self.replicas.pop(handle.replica_id, None)

    # -- inventory and per-node weights ------------------------------------

    async def inventory(self) -> list[Slot]:
        return slots_from_nodes(cluster_nodes(), self.gpu_memory_bytes)

    async def node_caches(self) -> dict[str, set[str]]:
        """Weight-cache keys (pool.weights.cache.entry_key) held by each alive GPU node.

        Each node is asked with a short task; one that does not answer in time
        (a busy node starting a worker) is answered from what it held after its
        last pull or probe, so a cold start never waits long for a preference.
        """
        nodes = gpu_nodes(cluster_nodes())
        refs = [self._probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                .remote(str(self.settings.cache_dir)) for n in nodes]
        found = await asyncio.gather(*(ref_result(r, PROBE_TIMEOUT_S) for r in refs), return_exceptions=True)
        for node, keys in zip(nodes, found):
            if not isinstance(keys, BaseException):
                self._node_keys[node] = set(keys)
        return {n: set(self._node_keys[n]) for n in nodes if n in self._node_keys}

    async def nodes_holding(self, keys: Iterable[str]) -> set[str]:
        """Nodes whose cache already has every one of keys: preferred for a cold start."""
        wanted = set(keys)
        return {node for node, held in (await self.node_caches()).items() if wanted <= held}

    # -- replicas ----------------------------------------------------------

    async def start_replica(self, spec: RevisionSpec, launch: ReplicaLaunch, slots: Sequence[Slot],
                            replica_id: str, *, registration: Optional[Registration] = None) -> RayReplica:
        """launch.folder: a folder the node may read as is; None: the node pulls spec.model_uri."""
        group = await self._reserve_group(slots, replica_id)
        actor = self._actor_class.options(**self._actor_options(slots, group, replica_id)).remote(
            replica_id, str(self.settings.logs))
        try:
            handle = await self._launch(actor, group, spec, launch, replica_id)
            await self._remember(handle, spec, slots, registration)
        except BaseException:
            release(actor, group)
            raise
        handle.watch = asyncio.ensure_future(watch(handle))
        self.replicas[replica_id] = handle
        log.info("replica %s on node %s at %s", replica_id, handle.node_id[:12], handle.base_url)
        return handle

    async def _launch(self, actor: Any, group: Optional[PlacementGroup], spec: RevisionSpec, launch: ReplicaLaunch,
                      replica_id: str) -> RayReplica:
        s = self.settings
        local = str(launch.folder) if launch.folder is not None else None
        folder = await self._await(actor.model_folder.remote(local, spec.model_uri, s, dict(spec.pins)),
                                   s.pull_timeout_s, "placing the replica or pulling its weights")
        on_node, env_s = await self._on_node(actor, launch, Path(folder), spec)
        secret = new_secret()          # in the child's environment, passed as an argument of the call
        started = actor.launch.remote(on_node, secret, s, self.bind_host, None)
        where = await self._await(started, s.load_timeout_s, "starting the runtime")
        await self._note_cache(actor, where["node_id"])
        return RayReplica(replica_id, where["base_url"], where["node_id"], tuple(where["gpu_ids"]),
                          where["child_pid"], actor, secret, group, env_s=env_s)

    async def _on_node(self, actor: Any, launch: ReplicaLaunch, folder: Path,
                       spec: RevisionSpec) -> tuple[ReplicaLaunch, float]:
        """The launch as its node has it: the node's folder, a function's venv built there
        when the pool built none (and the seconds it took), a draft model pulled there."""
        program, interpreter, env_s = launch.program, launch.interpreter, 0.0
        if isinstance(program, FunctionServer) and interpreter is None:
            env = await self._function_env(actor, str(folder), spec.tenant_id)
            interpreter, env_s = env.python, env.seconds
        elif isinstance(program, ModelServer):
            program = await self._pull_draft(actor, program, spec.pins)
        return replace(launch, program=program, interpreter=interpreter, folder=folder), env_s

    async def _function_env(self, actor: Any, package_dir: str, tenant_id: str) -> function_env.FunctionEnv:
        """The package's venv on the actor's node, built or found in its cache (the same stage
        and timeout as the local backend's). A build cut short is stopped there first: pip's
        own children would outlive the actor."""
        try:
            answer = await self._await(actor.function_env.remote(package_dir, self.settings, tenant_id),
                                       self.settings.pull_timeout_s, "building the function's environment")
        except BaseException:
            await stop_children(actor, self.settings.stop_timeout_s)
            raise
        return function_env.built_env(*answer)

    async def _remember(self, handle: RayReplica, spec: RevisionSpec, slots: Sequence[Slot],
                        registration: Optional[Registration]) -> None:
        """The replica's record, kept by its actor for the next pool."""
        record = record_for(spec, handle.node_id, [s.slot_id for s in slots], handle.replica_id,
                            base_url=handle.base_url, secret=handle.secret, registration=registration,
                            started_at=datetime.now(timezone.utc))
        await self._await(handle.actor.remember.remote(record.to_json()), PROBE_TIMEOUT_S * 6,
                          "registering the replica")

    # -- what an earlier pool left -----------------------------------------

    async def survivors(self) -> list[Survivor]:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == self.namespace and a["name"].startswith(ACTOR_PREFIX)]
        found = await asyncio.gather(*(self._survivor(name) for name in names))
        return [survivor for survivor in found if survivor is not None]

    async def _survivor(self, name: str) -> Optional[Survivor]:
        """One named replica actor: on our books if its runtime still runs, else killed."""
        try:
            actor = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return None                              # gone since it was listed
        try:
            info = await ref_result(actor.describe.remote(), PROBE_TIMEOUT_S * 6)
            record = ReplicaRecord.from_json(info["record"]) if info["record"] else None
        except (RayError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("killing replica actor %s: it cannot say what it runs (%s)", name, short_error(exc))
            release(actor, None)
            return None
        group = group_by_id(info["placement_group"])
        if record is None or info["returncode"] is not None:
            release(actor, group)                    # never registered, or its runtime has exited
            return Survivor(record, None) if record is not None else None
        handle = RayReplica(record.replica_id, record.base_url, info["node_id"], tuple(info["gpu_ids"]),
                            info["child_pid"], actor, record.secret, group)
        handle.watch = asyncio.ensure_future(watch(handle))
        self.replicas[record.replica_id] = handle
        return Survivor(record, handle)

    async def _pull_draft(self, actor: Any, program: ModelServer, pins: Pins) -> ModelServer:
        """A speculative draft model named by URI is pulled into the node's cache too."""
        uri = draft_model_uri(program.engine)
        if uri is None:
            return program
        folder = await self._await(actor.model_folder.remote(None, uri, self.settings, dict(pins)),
                                   self.settings.pull_timeout_s, "pulling the draft model")
        return program.with_engine(with_draft_folder(program.engine, folder))

    async def _note_cache(self, actor: Any, node_id: str) -> None:
        """Remember what this node's cache holds now (it may just have pulled)."""
        try:
            self._node_keys[node_id] = set(await ref_result(actor.cached.remote(str(self.settings.cache_dir)),
                                                            PROBE_TIMEOUT_S))
        except (RayError, asyncio.TimeoutError):
            pass                       # only a hint for later placements

    async def _await(self, ref: Any, timeout_s: float, stage: str) -> Any:
        try:
            return await ref_result(ref, timeout_s)
        except asyncio.TimeoutError:
            raise ColdStartFailed(f"ray: {stage} timed out after {timeout_s:g}s") from None
        except RayError as exc:
            raise ColdStartFailed(f"ray: {stage} failed: {short_error(exc)}") from exc

    async def _reserve_group(self, slots: Sequence[Slot], replica_id: str) -> Optional[PlacementGroup]:
        """Multi-GPU replicas: one bundle of all their GPUs, STRICT_PACK on the chosen node.

        One bundle, not one per GPU: a Ray actor draws its resources from one
        bundle, and the runtime needs every GPU of a tensor-parallel replica
        visible in its one process.
        """
        if len(slots) < 2:
            return None
        node = self._target_node(slots)
        group: PlacementGroup = placement_group([{"GPU": float(len(slots))}], strategy="STRICT_PACK",
                                                name=f"{ACTOR_PREFIX}{replica_id}", lifetime="detached",
                                                _soft_target_node_id=node)
        try:
            await self._await(group.ready(), self.settings.load_timeout_s,
                              f"reserving {len(slots)} GPUs on one node")
        except BaseException:
            remove_placement_group(group)
            raise
        return group

    def _actor_options(self, slots: Sequence[Slot], group: Optional[PlacementGroup],
                       replica_id: str) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": 0, "num_gpus": float(max(1, len(slots))), "max_restarts": 0,
                                   "max_concurrency": ACTOR_THREADS, "namespace": self.namespace,
                                   "name": f"{ACTOR_PREFIX}{replica_id}", "lifetime": "detached"}
        node = self._target_node(slots)
        if group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        elif node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return options

    def _target_node(self, slots: Sequence[Slot]) -> Optional[str]:
        """The Ray node the pool placed on; None for slots that are not Ray nodes (Ray picks)."""
        nodes = {s.node for s in slots}
        if len(nodes) != 1:
            return None
        node = nodes.pop()
        known = {n["NodeID"]: n["Alive"] for n in cluster_nodes()}
        if node in known and not known[node]:
            raise ColdStartFailed(f"ray: node {node[:12]} has left the cluster")
        return node if node in known else None


# ----------------------------------------------------------------- helpers

@contextlib.contextmanager
def embedders_signal_handlers() -> Iterator[None]:
    """Puts back the process's SIGTERM and SIGINT handlers after the block (ray.init).

    ray.init sets a SIGTERM handler of its own (sys.exit) in the driver: a SIGTERM to
    the process that embeds the pool (`thawpool up` under systemd) would then end it
    without its shutdown, leaving its replica actors, Postgres and S3 running.
    signal.signal re-arms the C handler too, over any a native library set meanwhile.
    """
    if threading.current_thread() is not threading.main_thread():
        yield                           # handlers belong to the main thread only
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:     # None: set outside Python, nothing to put back
                signal.signal(sig, handler)


def node_cache_keys(default_cache_dir: str) -> list[str]:
    """Runs on one node as a Ray task: the keys in that node's weight cache."""
    return cache_entries(node_cache_dir(Path(default_cache_dir)))


def cluster_nodes() -> list[dict[str, Any]]:
    """ray.nodes(): one dict per node the head knows, alive or not."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def slots_from_nodes(nodes: Sequence[dict[str, Any]], gpu_memory_bytes: int) -> list[Slot]:
    """One cuda Slot per GPU of each alive node (Ray knows GPU counts, not their memory),
    of the type Ray detected on the node (its `accelerator_type:<type>` resource).

    Exclusive: an actor asks Ray for whole GPUs (num_gpus = its slot count), so two
    small replicas cannot share a slot the way local processes share a device.
    """
    return [Slot(f"ray-{n['NodeID'][:12]}/gpu{i}", n["NodeID"], "cuda", gpu_memory_bytes, i, exclusive=True,
                 gpu_kind=node_gpu_kind(n["Resources"]))
            for n in nodes if n["Alive"] for i in range(int(n["Resources"].get("GPU", 0)))]


def node_gpu_kind(resources: dict[str, Any]) -> str:
    """The node's GPU type as Ray names it (accelerator_type:A100-80G -> a100-80g), else ""."""
    types = sorted(k.split(":", 1)[1].lower() for k in resources if k.startswith(RAY_ACCELERATOR_PREFIX))
    return types[0] if len(types) == 1 else ""


def gpu_nodes(nodes: Sequence[dict[str, Any]]) -> list[str]:
    return [n["NodeID"] for n in nodes if n["Alive"] and n["Resources"].get("GPU", 0) > 0]


async def watch(handle: RayReplica) -> None:
    """Sets handle.reason once the runtime process exits or the actor dies."""
    reason = await wait_for_end(handle.actor, handle.node_id)
    if handle.reason is None:
        handle.reason = reason


async def wait_for_end(actor: Any, node_id: str, retry_s: float = 0.5) -> str:
    """Why the replica ended. An unavailable actor (its connection dropped) is asked
    again until Ray decides: it comes back, or it is declared dead with the reason,
    for a lost node once the head has missed its health checks."""
    while True:
        try:
            code = await ref_result(actor.wait_exit.remote(WAIT_SLICE_S), None)
        except ActorUnavailableError:
            await asyncio.sleep(retry_s)
            continue
        except RayError as exc:
            return f"ray actor of the replica died: {short_error(exc)}"
        if code is None:
            continue                   # still running after one slice: ask again
        try:
            tail = await ref_result(actor.log_tail.remote(300), 10)
        except (RayError, asyncio.TimeoutError):
            tail = ""
        last = (tail.splitlines() or [""])[-1]
        return f"runtime process on node {node_id[:12]} exited with code {code}: {last}".rstrip(": ")


async def ref_result(ref: Any, timeout_s: Optional[float]) -> Any:
    """Await a Ray ObjectRef on this event loop, with an optional timeout."""
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)


async def stop_children(actor: Any, timeout_s: float) -> None:
    """Ask the actor to stop its children (SIGTERM, SIGKILL after timeout_s)."""
    try:
        await ref_result(actor.stop.remote(timeout_s), 2 * timeout_s + 5)
    except (RayError, asyncio.TimeoutError):
        pass                           # the actor is gone already or stuck: the caller kills it anyway


def group_by_id(hex_id: Optional[str]) -> Optional[PlacementGroup]:
    """The placement group an actor reports it runs in (a multi-GPU replica), by its id."""
    return PlacementGroup(ray.PlacementGroupID(bytes.fromhex(hex_id))) if hex_id else None


def release(actor: Any, group: Optional[PlacementGroup]) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except (RayError, ValueError):
        pass
    if group is not None:
        try:
            remove_placement_group(group)
        except RayError:
            pass


def short_error(exc: BaseException) -> str:
    """The lines of a Ray error that say why (it also prints actor ids, pids, namespaces)."""
    if isinstance(exc, GetTimeoutError):
        return "timed out"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    why = [line for line in lines if "died" in line or "node" in line.lower() or "Error" in line]
    return " ".join(why or lines[:1])[:400] or type(exc).__name__
