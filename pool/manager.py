"""PoolManager: `pool.api.Pool`, the loop that acts on the pool's decisions.

The decisions are pure (placement.place, autoscaler.policy, router.choose,
backoff.after_failure); the books they read are kept apart (registry.py:
revisions and their replicas; capacity.py: slots and reservations); a cold
start is cold_start.py and every replica transition goes through
replica_events.py. This module wires them: acquire() routes a request to a
ready replica or queues it and starts one (a tenant's quota bounds its
waiting requests, and a replica held back by its GPU quota turns the wait's
timeout into 429); _reconcile() scales a revision to what the autoscaler
decides; a tick every `tick_s` re-reads the desired state and the backend's
inventory (every `desired_refresh_s`: nodes of a cluster come and go),
notices crashed processes, finishes drains and sends a heartbeat (every
`heartbeat_s`: each replica holding slots, with the tokens it says it
served). Everything runs on one event loop; state changes happen between
awaits.

At start, before taking requests, the replicas an earlier pool left running
are re-adopted, stopped or forgotten (pool/survivors.py), and the first
heartbeat (pool/heartbeats.py) lists what the pool holds then. A replica's
own token counters are read as it stops and go on its `stopped` event.

The sleep tier: a revision with `sleep_timeout_s` drains its idle replicas into
sleep instead of stopping them, and wakes them before it starts new ones
(pool/sleepers.py).

Prefetch (pool/weights/prefetch.py decides, pool/prefetcher.py pulls): a revision whose spec
has `prefetch` gets its weights pulled into the cache in the background when it appears
in the desired state and on each scale-up, holding no slot; its status says whether its
weights are cached (`weights_cached`).

The backend comes from the settings (`pool.backends.build_backend`) unless one
is injected.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Optional

import httpx

from pool.activator import Waiter, wait_for_replica
from pool.adapter_loads import AdapterLoads
from pool.api import (AdapterInfo, AdapterRef, ColdStartFailed, ColdStartTimeout, DesiredStateSource, ModelInfo,
                      NeverFits, ReplicaEventSink, ReplicaShape, RevisionSpec, RevisionStatus)
from pool.autoscaler import Decision, policy
from pool.backends import build_backend
from pool.backends.base import Backend, ReplicaHandle
from pool.backends.runtime_args import draft_model_uri
from pool.background import BackgroundTasks
from pool.backoff import BackoffConfig, may_start
from pool.capacity import Capacity
from pool.clock import Clock
from pool.cold_start import ColdStart, cold_start_timings, failure_reason
from pool.failures import ReplicaFailures
from pool.heartbeats import Heartbeats
from pool.inventory import Slot
from pool.lease import ReplicaLease
from pool.replica_http import replica_client
from pool.registry import (ManagedReplica, Registry, RevisionState, revision_status,
                           scale_down_order, scaling_snapshot, weight_keys)
from pool.replica import LIVE, STARTING, Replica, ReplicaState
from pool.replica_events import ReplicaEvents
from pool.prefetcher import Prefetcher
from pool.sleep_tier import SleepTier
from pool.s3 import open_client
from pool.request_refusals import backoff_refusal, gpu_quota_refusal, queue_refusal_for
from pool.settings import PoolSettings
from pool.sleepers import Sleepers
from pool.stopping import ReplicaStopper
from pool.survivors import Survivors
from pool.weights.sources import SourceStores
from pool.weights.cache import WeightCache
from pool.weights.store import WeightStore

log = logging.getLogger(__name__)
READY, DRAINING = ReplicaState.READY, ReplicaState.DRAINING
SLEEPING, WAKING = ReplicaState.SLEEPING, ReplicaState.WAKING


@dataclass(frozen=True)
class Running:
    """What start() opens and stop() closes."""
    weights: WeightStore
    http: httpx.AsyncClient
    cold_start: ColdStart
    sleep_tier: SleepTier
    prefetcher: Prefetcher
    heartbeats: Heartbeats
    stopper: ReplicaStopper
    failures: ReplicaFailures
    sleepers: Sleepers
    adapters: AdapterLoads


class PoolManager:
    def __init__(self, settings: PoolSettings, desired: DesiredStateSource, events: ReplicaEventSink, *,
                 backend: Optional[Backend] = None, clock: Optional[Clock] = None, s3_client: Any = None):
        self.settings = settings
        self.desired = desired
        self.clock = clock or Clock()
        self.backend: Backend = backend if backend is not None else build_backend(settings)
        self.capacity = Capacity(settings)
        self._events = ReplicaEvents(events, self.clock, limit=settings.event_queue_limit,
                                     retry_cap_s=settings.event_retry_cap_s,
                                     kind_of=self.capacity.kind_of)
        self._registry = Registry(settings.queue_limit)
        self._backoff = BackoffConfig(settings.crash_backoff_base_s, settings.crash_backoff_cap_s)
        self._s3 = s3_client
        self._opened: Optional[Running] = None
        self._ticker: Optional[asyncio.Task[None]] = None
        self._tasks = BackgroundTasks()
        self._stack = AsyncExitStack()
        self._last_refresh = float("-inf")
        self._last_inventory = float("-inf")
        self.started = False

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._s3 is None:
            self._s3 = await open_client(self.settings, self._stack)
        weights = WeightStore(self._s3, WeightCache(self.settings.cache_dir, self.settings.cache_budget_bytes),
                              self.settings)
        http = replica_client(httpx.Timeout(5.0, connect=1.0))
        stores = SourceStores(weights, self.desired, self._stack)
        cold_start = ColdStart(self.settings, self.backend, self.capacity, self._events, stores, http)
        sleep_tier = SleepTier(self.settings, self.backend, self.capacity, self._events, http, self.clock)
        stopper = ReplicaStopper(self.backend, self.capacity, self._events, weights, http,
                                 self.settings.stop_timeout_s)
        self._opened = Running(weights, http, cold_start, sleep_tier,
                               Prefetcher(stores, self.settings),
                               Heartbeats(self._registry, self._events, self.clock, http, self.settings.heartbeat_s),
                               stopper, ReplicaFailures(self._events, self.clock, self._backoff, stopper, http,
                                                        self._tasks.spawn),
                               Sleepers(self.settings, self._registry, sleep_tier, stopper, self._tasks.spawn),
                               AdapterLoads(stores, http, capacity=self.settings.adapters_per_replica,
                                            timeout_s=self.settings.adapter_load_timeout_s))
        await self.backend.start()
        self.started = True                      # from here on, stop() undoes what start() did
        await self.capacity.update(await self.backend.inventory())
        self._last_inventory = self.clock.mono()
        self._events.start()
        await self._read_desired()
        await Survivors(self.backend, self.capacity, self._registry, self._events, self.clock, http,
                        self.settings.stop_timeout_s).take_over()
        await self._running.heartbeats.send()
        self._ticker = asyncio.ensure_future(self._run())
        self._reconcile_all()

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        await self._running.prefetcher.close()
        await self._stop_replicas()
        await self.backend.close()
        self._events.beat(self._running.heartbeats.now({}))   # nothing holds slots any more
        await self._events.close(self.settings.stop_timeout_s)
        await self._running.http.aclose()
        await self._stack.aclose()

    async def _stop_replicas(self) -> None:
        closing = ColdStartFailed("the pool is shutting down", retry_after_s=5.0)
        revisions = self._registry.all()
        for rev in revisions:
            rev.queue.fail_all(closing)
        await asyncio.gather(*(self._running.stopper.shutdown(r) for rev in revisions for r in rev.in_state(*LIVE)),
                             return_exceptions=True)
        await self._tasks.wait()

    async def __aenter__(self) -> PoolManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def _running(self) -> Running:
        if self._opened is None:
            raise RuntimeError("PoolManager.start() has not run")
        return self._opened

    @property
    def slots(self) -> list[Slot]:
        return self.capacity.slots

    def handle(self, replica_id: str) -> Optional[ReplicaHandle]:
        """The backend handle of a replica (its process, for the local backend)."""
        managed = self._registry.replica(replica_id)
        return managed.handle if managed is not None else None

    # ------------------------------------------------------------- the seam (pool.api.Pool)

    async def inspect_model(self, model_uri: str, tenant_id: Optional[str] = None) -> ModelInfo:
        return await self._running.cold_start.inspect(model_uri, tenant_id)

    async def inspect_adapter(self, adapter_uri: str, tenant_id: Optional[str] = None) -> AdapterInfo:
        return await self._running.cold_start.inspect_adapter(adapter_uri, tenant_id)

    def check_fits(self, info: ModelInfo, shape: ReplicaShape) -> None:
        """NeverFits for a shape no inventory could hold; ModelUnavailable for a draft model
        that is not a URI (sized at its cold start, once it is inspected)."""
        draft_model_uri(shape.engine)
        reason = self.capacity.never_fits(self.capacity.request(info, shape))
        if reason:
            raise NeverFits(f"{info.model_uri} can never be placed: {reason}")

    async def acquire(self, spec: RevisionSpec, *, request_id: str, prefix_key: Optional[str],
                      prompt_tokens: int, timeout_s: float, adapter: Optional[AdapterRef] = None,
                      priority: int = 0) -> ReplicaLease:
        lease = await self._acquire(spec, request_id, prefix_key, prompt_tokens, timeout_s, adapter, priority)
        if adapter is not None:
            await self._with_adapter(lease, adapter)
        return lease

    async def _acquire(self, spec: RevisionSpec, request_id: str, prefix_key: Optional[str],
                       prompt_tokens: int, timeout_s: float, adapter: Optional[AdapterRef],
                       priority: int) -> ReplicaLease:
        rev = await self._revision_for(spec)
        start = self.clock.mono()
        rev.arrived(start)
        name = adapter.name if adapter is not None else None
        picked = rev.route(prefix_key, name) or await rev.route_after_checks(prefix_key, name)
        if picked is not None:
            return self._lease(rev, picked, start, cold=False)
        refused = backoff_refusal(rev, self.clock.mono()) or queue_refusal_for(self._registry, rev)
        if refused is not None:
            raise refused
        waiter = Waiter(request_id, prompt_tokens, prefix_key, start, priority)
        rev.queue.push(waiter)
        self._reconcile(rev)                     # the first request starts the cold start now
        try:
            replica_id = await wait_for_replica(rev.queue, waiter, timeout_s,
                                                on_lost=lambda rid: self._release_replica(rev, rid),
                                                retry_after_s=2.0 if rev.in_state(ReplicaState.LOADING) else 5.0)
        except ColdStartTimeout as timeout:
            raise (gpu_quota_refusal(rev) or timeout) from None
        return self._lease(rev, replica_id, start, cold=True)

    async def _with_adapter(self, lease: ReplicaLease, adapter: AdapterRef) -> None:
        """The adapter into the lease's replica (when it lacks it), held there until the
        lease is released; a failed load gives the lease back."""
        managed = self._registry.replica(lease.replica_id)
        try:
            if managed is None or managed.handle is None:
                raise ColdStartFailed(f"replica {lease.replica_id} went away before the request reached it",
                                      retry_after_s=1.0)
            managed.adapters.use(adapter.name)
            lease.on_release(lambda: managed.adapters.done(adapter.name))
            lease.adapter_load = await self._running.adapters.ensure(
                lease.replica_id, managed.handle, managed.adapters, adapter)
        except BaseException:
            lease.release()
            raise

    def revision_status(self, revision_id: str) -> RevisionStatus:
        rev = self._registry.get(revision_id)
        if rev is None:
            return RevisionStatus(revision_id, "unknown")
        keys = weight_keys(rev)
        return revision_status(rev, weights_cached=bool(keys) and self._running.weights.cache.holds(keys))

    async def refresh(self) -> None:
        await self._read_desired()
        self._reconcile_all()

    @property
    def sandbox(self) -> str:
        return self.settings.sandbox

    async def _read_desired(self) -> None:
        specs = await self.desired.revisions()
        self._last_refresh = self.clock.mono()
        self._registry.sync(specs)
        self.capacity.set_quotas(self._registry.quotas())

    # ------------------------------------------------------------- requests

    async def _revision_for(self, spec: RevisionSpec) -> RevisionState:
        rev = self._registry.deployed(spec.revision_id)
        if rev is None:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - e.g. the control plane's database is down
                raise ColdStartFailed(f"cannot read the desired state: {type(exc).__name__}: {exc}") from exc
            rev = self._registry.deployed(spec.revision_id)
        if rev is None:
            raise ColdStartFailed(f"revision {spec.revision_id} is not in the desired state")
        return rev

    def _lease(self, rev: RevisionState, replica_id: str, start: float, cold: bool) -> ReplicaLease:
        managed = rev.replicas.get(replica_id)
        if managed is None or managed.handle is None:
            raise ColdStartFailed(f"replica {replica_id} went away before the request reached it",
                                  retry_after_s=1.0)
        queue_s = self.clock.mono() - start
        rev.note_in_flight(self.clock.mono())
        return ReplicaLease(base_url=managed.handle.base_url, replica_id=replica_id,
                            revision_id=rev.spec.revision_id, queue_s=queue_s,
                            cold_start=cold_start_timings(managed.replica, queue_s) if cold else None,
                            headers=managed.handle.headers,
                            on_release=lambda lease: self._release_replica(rev, lease.replica_id),
                            on_failed=lambda lease: self._running.failures.check_soon(rev, lease.replica_id))

    def _release_replica(self, rev: RevisionState, replica_id: str) -> None:
        managed = rev.replicas.get(replica_id)
        rev.last_activity = self.clock.mono()
        if managed is None:
            return
        managed.in_flight = max(0, managed.in_flight - 1)
        rev.note_in_flight(self.clock.mono())
        if managed.state is DRAINING and managed.in_flight == 0:
            self._tasks.spawn(self._finish_drain(managed))

    # ------------------------------------------------------------- scaling

    def _reconcile_all(self) -> None:
        for rev in self._registry.all():
            self._reconcile(rev)
        self._look_ahead()

    def _look_ahead(self) -> None:
        """Pull the weights of revisions due (prefetch), and tell the backend which calls
        are predicted, so its warm standbys prepare for those models."""
        prefetcher, now = self._running.prefetcher, self.clock.mono()
        prefetcher.start_due(self._registry.all(), not self.backend.pulls_on_node, now)
        self.backend.expect(prefetcher.predicted(self._registry.all(), now))

    def _reconcile(self, rev: RevisionState) -> None:
        if rev.retired:                          # no longer deployed: drain everything now
            decision = Decision(0, "revision no longer deployed",
                                expired=tuple(m.replica_id for m in rev.in_state(SLEEPING)))
        else:
            snapshot = scaling_snapshot(rev, self.clock.mono(), self.settings)
            decision, rev.policy_state = policy(snapshot, rev.policy_state)
        rev.desired = decision.desired
        live = rev.in_state(*STARTING, WAKING, READY)
        if rev.desired > len(live) and may_start(rev.backoff, self.clock.mono()):
            rev.scale_ups += 1                   # a prefetch joins the pulls (pool/weights/prefetch.py)
            for _ in range(rev.desired - len(live)):
                self._wake_or_start(rev)
        elif rev.desired < len(live):
            to_sleep = decision.sleep and self._running.sleep_tier.can_sleep(rev.spec)
            for managed in scale_down_order(live)[:len(live) - rev.desired]:
                self._scale_down(managed, decision.reason, to_sleep)
        for replica_id in decision.expired:
            self._running.sleepers.stop(rev.replicas[replica_id], f"asleep for {rev.spec.sleep_timeout_s:g}s")

    def _new_replica(self, rev: RevisionState) -> None:
        replica = Replica(f"rep-{uuid.uuid4().hex[:12]}", rev.spec.revision_id,
                          self.clock.mono(), self.clock.utc())
        managed = ManagedReplica(replica, rev.spec, expected_load=rev.next_replica_load(self.clock.mono()))
        rev.add(managed)
        self._events.publish(managed)
        managed.task = self._tasks.spawn(self._cold_start(rev, managed))

    def _scale_down(self, managed: ManagedReplica, reason: str, to_sleep: bool = False) -> None:
        if managed.state in STARTING:
            if managed.task:
                managed.task.cancel()
            self._tasks.spawn(self._running.stopper.shutdown(managed, reason=f"scaled down while starting: {reason}"))
        elif managed.state is READY:
            managed.drain_to = SLEEPING if to_sleep else ReplicaState.STOPPED
            self._events.move(managed, DRAINING, f"{reason}: to sleep" if to_sleep else reason)
            managed.drain_started = self.clock.mono()
            if managed.in_flight == 0:
                self._tasks.spawn(self._finish_drain(managed))

    async def _cold_start(self, rev: RevisionState, managed: ManagedReplica) -> None:
        try:
            await self._running.cold_start.run(managed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes the replica's reason
            self._running.failures.fail(rev, managed, failure_reason(exc))
            return
        self._events.move(managed, READY)
        rev.last_error = None
        rev.queue.dispatch(lambda waiter: rev.route(waiter.prefix_key))

    # ------------------------------------------------------------- failure and stop

    async def _finish_drain(self, managed: ManagedReplica) -> None:
        if managed.state is not DRAINING:
            return
        rev = self._registry.get(managed.spec.revision_id)
        if managed.drain_to is SLEEPING and rev is not None:
            if await self._running.sleepers.put_to_sleep(managed):
                self._reconcile(rev)             # a request that came meanwhile wakes it now
        else:
            await self._running.stopper.shutdown(managed)

    # ------------------------------------------------------------- the sleep tier (pool/sleepers.py)

    def _wake_or_start(self, rev: RevisionState) -> None:
        """One more awake replica: a sleeper woken, a wait for one falling asleep, or a cold start."""
        choice = self._running.sleepers.next_awake(rev)
        if choice.wake is not None:
            choice.wake.task = self._tasks.spawn(self._wake(rev, choice.wake))
        elif not choice.wait:
            self._new_replica(rev)

    async def _wake(self, rev: RevisionState, managed: ManagedReplica) -> None:
        if not await self._running.sleepers.wake(managed):
            self._reconcile(rev)
            return
        self._events.move(managed, READY)
        rev.queue.dispatch(lambda waiter: rev.route(waiter.prefix_key))

    # ------------------------------------------------------------- the loop

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the loop must survive one bad tick
                log.exception("pool tick failed")

    async def tick(self) -> None:
        if self.clock.mono() - self._last_inventory >= self.settings.desired_refresh_s:
            await self.refresh_inventory()
        if self.clock.mono() - self._last_refresh >= self.settings.desired_refresh_s:
            await self.refresh()
        for rev in self._registry.all():
            self._running.failures.notice_crashes(rev)
            self._expire_drains(rev)
            self._reconcile(rev)
        self._look_ahead()
        self._registry.drop_finished()
        self._running.heartbeats.send_if_due(self._tasks.spawn)

    def _expire_drains(self, rev: RevisionState) -> None:
        for managed in rev.in_state(DRAINING):
            started = managed.drain_started
            if started and self.clock.mono() - started >= self.settings.drain_timeout_s:
                self._tasks.spawn(self._running.stopper.shutdown(managed, reason="drain timed out"))

    async def refresh_inventory(self) -> None:
        """Re-read the backend's slots: a node that joined adds its slots (and wakes
        replicas waiting for capacity); a node that left takes its slots away. Replicas
        that ran there fail on their own when the backend sees them die."""
        self._last_inventory = self.clock.mono()
        try:
            fresh = await self.backend.inventory()
        except Exception as exc:  # noqa: BLE001 - keep the last known slots until it answers
            log.warning("cannot read the backend's inventory: %s", failure_reason(exc))
            return
        added, removed = await self.capacity.update(fresh)
        if added or removed:
            log.info("inventory: %d slot(s) joined, %d left; %d now", len(added), len(removed), len(fresh))
