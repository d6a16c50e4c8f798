"""One replica's cold start: inspect -> place -> pull -> load, each stage bounded.

  inspect   config.json and safetensors headers from S3 (cached per model URI),
            of the speculative draft model too when the engine names one
  place     best fit on the slots, preferring nodes that already hold the
            weights; waits in pending while the pool is full or its tenant is
            at its GPU quota (pool.admission decides who goes first). The
            replica moves to pulling the moment its slots are reserved: that
            event is the first to carry slot_ids, where its GPU time begins
  pull      the weights (and the draft's) into the pool's cache and model
            folders (pulling), pinned until the replica stops; a backend that
            pulls on its node does this inside start_replica
  load      the backend starts runtime.serve.server; the replica is loading until
            /health answers ready, with the replica's own stages of it (process,
            import, kernels, config, weights, ...), kept in the cold-start record
            as wire/replica_control.py bounds them

`ColdStart.run` moves the replica through pulling and loading and returns
when it is healthy; the manager marks it ready, or failed with
`failure_reason(exc)` when run raises.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Awaitable, FrozenSet, Optional, Sequence, TypeVar

import httpx

from pool.admission import WaitReason, never_within_quota
from pool.adoption import Registration, spec_fingerprint
from pool.api import (AdapterInfo, ColdStartFailed, ColdStartTimings, ModelInfo, ModelUnavailable, NeverFits, Pins,
                      RevisionSpec)
from pool.backends.base import Backend, ReplicaHandle
from pool.backends.runtime_args import draft_model_uri, engine_for, runtime_env, with_draft_folder
from pool.capacity import Capacity
from pool.function_env import build_env, memory_limit_mb
from pool.function_sandbox import FunctionSandboxes
from pool.health import wait_healthy
from pool.inventory import Slot
from pool.launch import Confinement, FunctionServer, ModelServer, ReplicaLaunch
from pool.weights.adapter_inspection import inspect_adapter
from pool.weights.inspection import inspect_model
from pool.placement import PlacementRequest, weights_of
from pool.registry import ManagedReplica
from pool.replica import Replica, ReplicaState
from pool.replica_events import ReplicaEvents
from pool.settings import PoolSettings
from pool.weights.sources import SourceStores
from pool.weights.cache import entry_key
from pool.weights.store import WeightStore, refuse_changed

log = logging.getLogger(__name__)
PREFERENCE_TIMEOUT_S = 30.0             # a backend stuck answering must not stall a cold start
T = TypeVar("T")


class ColdStart:
    def __init__(self, settings: PoolSettings, backend: Backend, capacity: Capacity,
                 events: ReplicaEvents, stores: SourceStores, http: httpx.AsyncClient):
        self.settings = settings
        self.backend = backend
        self.capacity = capacity
        self.events = events
        self.stores = stores
        self.http = http
        self.sandboxes = FunctionSandboxes.from_settings(settings) if not backend.pulls_on_node else None
        self._infos: dict[tuple[str, str], ModelInfo] = {}     # (origin, uri) -> info

    async def inspect(self, model_uri: str, tenant_id: Optional[str] = None) -> ModelInfo:
        """Read the model's description from S3 now, with the tenant's credentials for
        the bucket when it was granted some (and keep it for cold starts)."""
        return await self._inspect_with(await self.stores.store_for(tenant_id, model_uri), model_uri)

    async def inspect_adapter(self, adapter_uri: str, tenant_id: Optional[str] = None) -> AdapterInfo:
        """An adapter's two files, read now with the tenant's credentials for the bucket
        (kept nowhere: its checks and pins belong to the control plane)."""
        store = await self.stores.store_for(tenant_id, adapter_uri)
        try:
            return await inspect_adapter(store.client, adapter_uri, retry=store.downloader.retry)
        except ValueError as exc:
            raise ModelUnavailable(str(exc)) from exc

    async def _inspect_with(self, store: WeightStore, model_uri: str) -> ModelInfo:
        try:
            info = await inspect_model(store.client, model_uri, retry=store.downloader.retry)
        except ValueError as exc:
            raise ModelUnavailable(str(exc)) from exc
        self._infos[(store.origin, model_uri)] = info
        return info

    async def run(self, managed: ManagedReplica) -> None:
        s = self.settings
        draft_uri = draft_model_uri(managed.spec.engine)          # ModelUnavailable unless a URI
        tenant, pins = managed.spec.tenant_id, managed.spec.pins
        info = await stage(self._model_info(managed.spec.model_uri, tenant, pins), s.pull_timeout_s,
                           "inspecting the model")
        draft = await stage(self._model_info(draft_uri, tenant, pins), s.pull_timeout_s,
                            "inspecting the draft model") if draft_uri else None
        request = replace(self.capacity.request(info, managed.spec.shape, draft), load=managed.expected_load)
        managed.weight_bytes = weights_of(info, managed.spec.engine)
        await self._place(managed, request, await self._nodes_with_weights(managed.spec.model_uri, tenant))
        handle = await self._pull_and_launch(managed, draft_uri)
        ready = await stage(wait_healthy(handle, self.http, s.health_poll_s), s.load_timeout_s, "loading")
        managed.replica.load_stages = dict(ready.load_timings)
        log.info("replica %s loaded: %s", managed.replica_id,
                 " ".join(f"{k}={v:g}" for k, v in managed.replica.load_stages.items()) or "no stages reported")

    async def _model_info(self, model_uri: str, tenant_id: str, pins: Pins) -> ModelInfo:
        """What placement sizes the replica by: read from the objects the revision pinned,
        never from bytes put under the same keys since (ColdStartFailed)."""
        store = await self.stores.store_for(tenant_id, model_uri)
        known = self._infos.get((store.origin, model_uri))
        info = known if known is not None else await self._inspect_with(store, model_uri)
        refuse_changed(model_uri, info.objects, pins)
        return info

    async def _nodes_with_weights(self, model_uri: str, tenant_id: str) -> FrozenSet[str]:
        """Nodes whose own cache already has every file of the model (empty: no preference).
        Only nodes that pull for themselves hold different weights; otherwise there is
        one cache, the pool's, and nothing to ask."""
        if not self.backend.pulls_on_node:
            return frozenset()
        try:
            store = await self.stores.store_for(tenant_id, model_uri)
            objects = await store.list_model(model_uri)
            nodes = await asyncio.wait_for(self.backend.nodes_holding([entry_key(o) for o in objects]),
                                           PREFERENCE_TIMEOUT_S)
            return frozenset(nodes)
        except Exception as exc:  # noqa: BLE001 - only a preference: place without it
            log.warning("cannot tell which nodes hold %s: %s", model_uri, failure_reason(exc))
            return frozenset()

    async def _place(self, managed: ManagedReplica, request: PlacementRequest, preferred: FrozenSet[str]) -> None:
        """Reserve slots for the replica, waiting in pending while none have room for it
        or its tenant is at its GPU quota; pulling once they are reserved."""
        spec = managed.spec
        reason = self.capacity.never_fits(request) or never_within_quota(request.slot_count, spec.quota)
        if reason:
            raise NeverFits(f"can never be placed: {reason}")

        def note(why: WaitReason) -> None:          # shown on the status page while it waits
            managed.waiting = why
        placed = await self.capacity.place(managed.replica_id, spec.tenant_id, request, preferred, note)
        managed.placed, managed.waiting = placed, None
        managed.replica.slot_ids = placed.slot_ids
        self.events.move(managed, ReplicaState.PULLING)       # its GPU time starts now, not before

    async def _pull_and_launch(self, managed: ManagedReplica, draft_uri: Optional[str]) -> ReplicaHandle:
        """pulling, then loading once the runtime process is started.

        A backend that pulls on its node gets a launch with no folder; its start_replica
        pulls there first (the draft model too, under its own pull timeout; a
        function's venv is built there too, and reported as the handle's env_s), so
        it runs while pulling. Otherwise the pool pulls (and builds a function's venv),
        and the runtime is given the draft's local folder in place of its URI.
        """
        spec, slots = managed.spec, self.capacity.slots_for(managed.replica.slot_ids)
        registration = Registration(spec_fingerprint(spec), managed.placed.bytes_per_slot if managed.placed else None)
        if self.backend.pulls_on_node:
            await self._refuse_own_credentials(spec.tenant_id, (spec.model_uri, draft_uri))
            launch = launch_for(spec, slots, self.settings, self.backend, folder=None)
            managed.handle = await self.backend.start_replica(spec, launch, slots, managed.replica_id,
                                                              registration=registration)
            managed.replica.env_s = managed.handle.env_s     # a function's venv, built on its node
            self.events.move(managed, ReplicaState.LOADING)
            return managed.handle
        model_dir = await self._pull(managed, spec.model_uri)
        pulled = spec
        if draft_uri is not None:
            pulled = replace(spec, engine=with_draft_folder(spec.engine, str(await self._pull(managed, draft_uri))))
        venv = await self._function_env(managed, model_dir) if spec.kind == "function" else None
        launch = launch_for(pulled, slots, self.settings, self.backend, folder=model_dir, venv=venv)
        self.events.move(managed, ReplicaState.LOADING)
        managed.handle = await self.backend.start_replica(spec, launch, slots, managed.replica_id,
                                                          registration=registration)
        return managed.handle

    async def _function_env(self, managed: ManagedReplica, package_dir: Path) -> str:
        """The interpreter of the function's venv (built, or cached by its requirements),
        timed as its own stage."""
        env = await stage(build_env(self.settings, package_dir, self.sandboxes, managed.spec.tenant_id),
                          self.settings.pull_timeout_s, "building the function's environment")
        managed.replica.env_s = env.seconds
        return env.python

    async def _refuse_own_credentials(self, tenant_id: str, uris: tuple[Optional[str], ...]) -> None:
        """A node pulls with the platform's credentials; it is never handed a tenant's."""
        for uri in uris:
            if uri is not None and await self.stores.access(tenant_id, uri) is not None:
                raise ColdStartFailed(f"{uri} is read with its tenant's own credentials, which "
                                      "only a backend the pool pulls for can use")

    async def _pull(self, managed: ManagedReplica, model_uri: str) -> Path:
        """A model folder in the pool's cache, pinned for the replica until it stops."""
        store = await self.stores.store_for(managed.spec.tenant_id, model_uri)
        files = await stage(store.fetch_model(model_uri, pins=managed.spec.pins),
                            self.settings.pull_timeout_s, "pulling")
        managed.files += (files,)
        managed.replica.downloaded_bytes += files.downloaded_bytes
        return files.model_dir


def launch_for(spec: RevisionSpec, slots: Sequence[Slot], settings: PoolSettings, backend: Backend, *,
               folder: Optional[Path], venv: Optional[str] = None) -> ReplicaLaunch:
    """What the replica's process is on `slots`, as far as the pool knows it: `folder` its
    weights or package as the pool pulled them (None: its node pulls them), `venv` a
    function's interpreter as the pool built it (None: its node builds it). Where a
    backend runs replicas on nodes of their own (pulls_on_node), the node also names a
    model's interpreter, and the pool's packed-layer cache is not there to map."""
    memory = memory_limit_mb(spec.gpu_memory_gb, len(slots), on_cuda=any(s.kind == "cuda" for s in slots))
    here = not backend.pulls_on_node
    program: ModelServer | FunctionServer
    if spec.kind == "function":
        program, interpreter, egress = FunctionServer(spec.revision_id, memory), venv, spec.quota.egress
    else:
        packed = (settings.packed_dir, settings.packed_cache_gb) if here else None
        engine = engine_for(spec, slots, settings.kv_cache_tokens_default, isolated=backend.isolates_gpus,
                            packed=packed)
        program, egress = ModelServer(spec.revision_id, engine), ()
        interpreter = settings.runtime_python if here else None
    sandbox = Confinement(spec.tenant_id, memory, egress) if settings.sandbox != "off" else None
    return ReplicaLaunch(program, interpreter, folder, runtime_env(settings.runtime_threads), sandbox)


async def stage(work: Awaitable[T], timeout_s: float, name: str) -> T:
    try:
        return await asyncio.wait_for(work, timeout_s)
    except asyncio.TimeoutError:
        raise ColdStartFailed(f"{name} timed out after {timeout_s:g}s") from None


def cold_start_timings(replica: Replica, queue_s: float) -> ColdStartTimings:
    """Seconds per stage of the thaw a request waited for, from the replica's transitions:
    its cold start, or the wake that made it ready again."""
    woken = replica.woken()
    if woken is not None:
        waking, ready = woken
        return ColdStartTimings(queue_s=queue_s, load_s=ready.mono - waking.mono,
                                total_s=ready.mono - waking.mono,
                                load_stages=dict(replica.wake_stages), kind="wake")
    ready_at = replica.entered(ReplicaState.READY) or replica.created_mono
    return ColdStartTimings(queue_s=queue_s, placement_s=replica.seconds_in(ReplicaState.PENDING),
                            download_s=replica.seconds_in(ReplicaState.PULLING) - replica.env_s,
                            downloaded_bytes=replica.downloaded_bytes, env_s=replica.env_s,
                            load_s=replica.seconds_in(ReplicaState.LOADING),
                            total_s=ready_at - replica.created_mono,
                            load_stages=dict(replica.load_stages))


def failure_reason(exc: BaseException) -> str:
    """The reason a replica failed, as the status page and ColdStartFailed show it."""
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    if not isinstance(exc, (ColdStartFailed, ModelUnavailable, NeverFits)):
        reason = f"{type(exc).__name__}: {reason}"
    return reason
