"""One replica's cold start: inspect -> place -> pull -> load, each stage bounded.

  inspect   config.json and safetensors headers from S3 (cached per model URI)
  place     best fit on the slots, preferring nodes that already hold the
            weights; waits in pending while the pool is full
  pull      the weights into the pool's cache and a model folder (pulling);
            a backend that pulls on its node does this inside start_replica
  load      the backend starts runtime.server; the replica is loading until
            /health answers ready

`ColdStart.run` moves the replica through pulling and loading and returns
when it is healthy; the manager marks it ready, or failed with
`failure_reason(exc)` when run raises.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, FrozenSet, TypeVar

import httpx

from pool.api import ColdStartFailed, ColdStartTimings, ModelInfo, ModelUnavailable, NeverFits
from pool.backends.base import Backend, ReplicaHandle
from pool.capacity import Capacity
from pool.health import wait_healthy
from pool.model_info import inspect_model
from pool.placement import Placed, PlacementRequest
from pool.registry import ManagedReplica
from pool.replica import Replica, ReplicaState
from pool.replica_events import ReplicaEvents
from pool.settings import PoolSettings
from pool.weights import WeightStore, entry_key

log = logging.getLogger(__name__)
PREFERENCE_TIMEOUT_S = 30.0             # a backend stuck answering must not stall a cold start
T = TypeVar("T")


class ColdStart:
    def __init__(self, settings: PoolSettings, backend: Backend, capacity: Capacity,
                 events: ReplicaEvents, weights: WeightStore, http: httpx.AsyncClient):
        self.settings = settings
        self.backend = backend
        self.capacity = capacity
        self.events = events
        self.weights = weights
        self.http = http
        self._infos: dict[str, ModelInfo] = {}

    async def inspect(self, model_uri: str) -> ModelInfo:
        """Read the model's description from S3 now (and keep it for cold starts)."""
        try:
            info = await inspect_model(self.weights.client, model_uri, retry=self.weights.retry)
        except ValueError as exc:
            raise ModelUnavailable(str(exc)) from exc
        self._infos[model_uri] = info
        return info

    async def run(self, managed: ManagedReplica) -> None:
        s = self.settings
        info = await stage(self._model_info(managed.spec.model_uri), s.pull_timeout_s, "inspecting the model")
        request = self.capacity.request(info, managed.spec.shape)
        await self._place(managed, request, await self._nodes_with_weights(managed.spec.model_uri))
        handle = await self._pull_and_launch(managed)
        await stage(wait_healthy(handle, self.http, s.health_poll_s), s.load_timeout_s, "loading")

    async def _model_info(self, model_uri: str) -> ModelInfo:
        if model_uri not in self._infos:
            await self.inspect(model_uri)
        return self._infos[model_uri]

    async def _nodes_with_weights(self, model_uri: str) -> FrozenSet[str]:
        """Nodes whose own cache already has every file of the model (empty: no preference).
        Only nodes that pull for themselves hold different weights; otherwise there is
        one cache, the pool's, and nothing to ask."""
        if not self.backend.pulls_on_node:
            return frozenset()
        try:
            objects = await self.weights.list_model(model_uri)
            nodes = await asyncio.wait_for(self.backend.nodes_holding([entry_key(o) for o in objects]),
                                           PREFERENCE_TIMEOUT_S)
            return frozenset(nodes)
        except Exception as exc:  # noqa: BLE001 - only a preference: place without it
            log.warning("cannot tell which nodes hold %s: %s", model_uri, failure_reason(exc))
            return frozenset()

    async def _place(self, managed: ManagedReplica, request: PlacementRequest, preferred: FrozenSet[str]) -> None:
        """Reserve slots for the replica, waiting in pending while none have room."""
        reason = self.capacity.never_fits(request)
        if reason:
            raise NeverFits(f"can never be placed: {reason}")
        while True:
            decision = self.capacity.try_place(managed.replica_id, request, preferred)
            if isinstance(decision, Placed):
                managed.placed, managed.waiting_reason = decision, None
                managed.replica.slot_ids = decision.slot_ids
                return
            managed.waiting_reason = decision.reason
            await self.capacity.wait_for_room(self.settings.tick_s * 4)

    async def _pull_and_launch(self, managed: ManagedReplica) -> ReplicaHandle:
        """pulling, then loading once the runtime process is started.

        A backend that pulls on its node gets no local folder; its start_replica
        pulls there first (under its own pull timeout), so it runs while pulling.
        """
        slots = self.capacity.slots_for(managed.replica.slot_ids)
        self.events.move(managed, ReplicaState.PULLING)
        if self.backend.pulls_on_node:
            managed.handle = await self.backend.start_replica(managed.spec, slots, None, managed.replica_id)
            self.events.move(managed, ReplicaState.LOADING)
            return managed.handle
        fetch = self.weights.fetch_model(managed.spec.model_uri)
        managed.files = await stage(fetch, self.settings.pull_timeout_s, "pulling")
        self.events.move(managed, ReplicaState.LOADING)
        managed.handle = await self.backend.start_replica(managed.spec, slots, managed.files.model_dir,
                                                          managed.replica_id)
        return managed.handle


async def stage(work: Awaitable[T], timeout_s: float, name: str) -> T:
    try:
        return await asyncio.wait_for(work, timeout_s)
    except asyncio.TimeoutError:
        raise ColdStartFailed(f"{name} timed out after {timeout_s:g}s") from None


def cold_start_timings(replica: Replica, queue_s: float) -> ColdStartTimings:
    """Seconds per stage of a replica's cold start, from its transitions."""
    ready_at = replica.entered(ReplicaState.READY) or replica.created_mono
    return ColdStartTimings(queue_s=queue_s, placement_s=replica.seconds_in(ReplicaState.PENDING),
                            download_s=replica.seconds_in(ReplicaState.PULLING),
                            load_s=replica.seconds_in(ReplicaState.LOADING),
                            total_s=ready_at - replica.created_mono)


def failure_reason(exc: BaseException) -> str:
    """The reason a replica failed, as the status page and ColdStartFailed show it."""
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    if not isinstance(exc, (ColdStartFailed, ModelUnavailable, NeverFits)):
        reason = f"{type(exc).__name__}: {reason}"
    return reason
