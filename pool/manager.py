"""PoolManager: the loop that acts on placement and autoscaling decisions.

The decisions are pure (placement.place, autoscaler.policy, router.choose);
this module owns the mutable state (revisions, replicas, slot reservations),
runs cold starts (inspect -> place -> pull -> load -> ready) as tasks, emits
a ReplicaEvent at every replica transition, and ticks every `tick_s` to
reconcile desired replica counts, notice crashed processes and finish drains.
Everything runs on one event loop; state changes happen between awaits.

The backend comes from the settings (`pool.backends.build_backend`) unless one
is injected. A cluster backend (Ray) adds three optional capabilities, used
when present: `inventory()` lists its slots across nodes and is re-read every
`desired_refresh_s` (nodes join and leave); `nodes_holding(keys)` names the
nodes whose cache has a revision's weights, preferred for its cold start; and
`pulls_on_node` means the node fetches the weights itself, so the pool does not.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, FrozenSet, Mapping, Optional, Sequence, Union

import httpx

from pool.activator import RevisionQueue, Waiter, wait_for_replica
from pool.api import (ColdStartFailed, ColdStartTimings, DesiredStateSource, ModelInfo,
                      ModelUnavailable, NeverFits, ReplicaEvent, ReplicaEventSink, ReplicaStatus,
                      RevisionSpec, RevisionStatus)
from pool.autoscaler import PolicyState, ScalingConfig, Snapshot, policy
from pool.backends import build_backend
from pool.backends.base import Backend, ReplicaHandle
from pool.inventory import Slot, discover_slots
from pool.lease import Lease
from pool.model_info import inspect_model
from pool.placement import (NoCapacity, Placed, PlacementRequest, SlotState, never_fits, place,
                            request_for)
from pool.replica import LIVE, STARTING, Replica, ReplicaState as S
from pool.router import Candidate, choose
from pool.s3 import open_client
from pool.settings import PoolSettings
from pool.weights import ModelFiles, WeightCache, WeightStore, entry_key

log = logging.getLogger(__name__)
KEEP_FINISHED = 8                       # stopped/failed replicas kept for status pages
PREFERENCE_TIMEOUT_S = 30.0             # a backend stuck answering must not stall a cold start


class Clock:
    def mono(self) -> float:
        return time.monotonic()

    def utc(self) -> datetime:
        return datetime.now(timezone.utc)


@dataclass
class ReplicaSlot:
    """A replica plus what the manager holds for it."""
    replica: Replica
    spec: RevisionSpec
    in_flight: int = 0
    handle: Optional[ReplicaHandle] = None
    files: Optional[ModelFiles] = None
    placed: Optional[Placed] = None
    waiting_reason: Optional[str] = None
    task: Optional[asyncio.Task] = None
    drain_started: Optional[float] = None
    stopping: bool = False              # being stopped on purpose: a dead handle is no crash

    @property
    def state(self) -> S:
        return self.replica.state

    @property
    def replica_id(self) -> str:
        return self.replica.replica_id


@dataclass
class RevisionState:
    spec: RevisionSpec
    queue: RevisionQueue
    replicas: dict[str, ReplicaSlot] = field(default_factory=dict)
    policy_state: PolicyState = PolicyState()
    last_activity: Optional[float] = None
    last_error: Optional[str] = None
    desired: int = 0
    failures: int = 0
    backoff_until: float = 0.0          # no new replica before this (crash backoff)
    refuse_until: float = 0.0           # after a failed cold start: answer 503 at once
    retired: bool = False

    def in_state(self, *states: S) -> list[ReplicaSlot]:
        return [r for r in self.replicas.values() if r.state in states]


class PoolManager:
    def __init__(self, settings: PoolSettings, desired: DesiredStateSource, events: ReplicaEventSink,
                 backend: Optional[Backend] = None, clock: Optional[Clock] = None,
                 s3_client: Any = None):
        self.settings = settings
        self.desired = desired
        self.events = events
        self.clock = clock or Clock()
        self._backend = backend
        self._s3 = s3_client
        self._revisions: dict[str, RevisionState] = {}
        self._infos: dict[str, ModelInfo] = {}
        self._slots: list[Slot] = []
        self._reserved: dict[str, dict[str, int]] = {}      # slot_id -> {replica_id: bytes}
        self._capacity = asyncio.Condition()
        self._event_queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._stack = AsyncExitStack()
        self._http: Optional[httpx.AsyncClient] = None
        self._last_refresh = float("-inf")
        self._last_inventory = float("-inf")
        self.weights: Optional[WeightStore] = None
        self.started = False

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> "PoolManager":
        if self._s3 is None:
            self._s3 = await open_client(self.settings, self._stack)
        cache = WeightCache(self.settings.cache_dir, self.settings.cache_budget_bytes)
        self.weights = WeightStore(self._s3, cache, self.settings)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=1.0))
        if self._backend is None:
            self._backend = build_backend(self.settings)
        await self._backend.start()
        self._slots = await self._discover_slots()
        self._reserved = {s.slot_id: {} for s in self._slots}
        self._last_inventory = self.clock.mono()
        self._tasks = [asyncio.ensure_future(self._emit_events()), asyncio.ensure_future(self._run())]
        self.started = True
        await self.refresh()
        return self

    async def _discover_slots(self) -> list[Slot]:
        """A backend that spans nodes (Ray) lists its slots; locally they are discovered."""
        inventory = getattr(self._backend, "inventory", None)
        if inventory is not None:
            return list(await inventory())
        return await asyncio.to_thread(discover_slots, self.settings)

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        for task in self._tasks[1:]:
            task.cancel()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        closing = ColdStartFailed("the pool is shutting down", retry_after_s=5.0)
        for rev in self._revisions.values():
            rev.queue.fail_all(closing)
        await asyncio.gather(*(self._shutdown_replica(r) for rev in self._revisions.values()
                               for r in list(rev.replicas.values()) if r.state in LIVE),
                             return_exceptions=True)
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._backend.close()
        try:
            await asyncio.wait_for(self._event_queue.join(), self.settings.stop_timeout_s)
        except asyncio.TimeoutError:
            log.warning("replica event sink did not take %d events before stop", self._event_queue.qsize())
        self._tasks[0].cancel()
        await asyncio.gather(self._tasks[0], return_exceptions=True)
        if self._http:
            await self._http.aclose()
        await self._stack.aclose()

    async def __aenter__(self) -> "PoolManager":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def slots(self) -> list[Slot]:
        return list(self._slots)

    @property
    def backend(self) -> Backend:
        return self._backend

    def handle(self, replica_id: str) -> Optional[ReplicaHandle]:
        """The backend handle of a replica (its process, for the local backend)."""
        for rev in self._revisions.values():
            if replica_id in rev.replicas:
                return rev.replicas[replica_id].handle
        return None

    # ------------------------------------------------------------- the seam

    async def inspect_model(self, model_uri: str) -> ModelInfo:
        try:
            info = await inspect_model(self._s3, model_uri, retry=self.weights.retry)
        except ValueError as exc:
            raise ModelUnavailable(str(exc)) from exc
        self._infos[model_uri] = info
        return info

    def check_fits(self, info: ModelInfo, spec_resources: Union[RevisionSpec, Mapping[str, Any]],
                   engine: Optional[Mapping[str, Any]] = None) -> None:
        request = self._placement_request(info, spec_resources, engine)
        reason = never_fits(request, self._slot_states())
        if reason:
            raise NeverFits(f"{info.model_uri} can never be placed: {reason}")

    async def acquire(self, spec: RevisionSpec, *, request_id: str, prefix_key: Optional[str] = None,
                      prompt_tokens: int = 0, timeout_s: float = 60.0) -> Lease:
        rev = await self._revision_for(spec)
        start = self.clock.mono()
        rev.last_activity = start
        picked = self._route(rev, prefix_key)
        if picked is not None:
            return self._lease(rev, picked, start, cold=False)
        self._refuse_during_backoff(rev)
        waiter = Waiter(request_id, prompt_tokens, prefix_key, start)
        rev.queue.push(waiter)
        self._reconcile(rev)                     # the first request starts the cold start now
        replica_id = await wait_for_replica(rev.queue, waiter, timeout_s,
                                            on_lost=lambda rid: self._release_replica(rev, rid),
                                            retry_after_s=self._retry_after(rev))
        slot = rev.replicas.get(replica_id)
        if slot is None or slot.handle is None:
            raise ColdStartFailed(f"replica {replica_id} went away before the request reached it",
                                  retry_after_s=1.0)
        return self._lease(rev, slot, start, cold=True)

    def revision_status(self, revision_id: str) -> RevisionStatus:
        rev = self._revisions.get(revision_id)
        if rev is None:
            return RevisionStatus(revision_id, "unknown")
        replicas = tuple(ReplicaStatus(
            r.replica_id, r.state.value, r.replica.slot_ids,
            r.handle.base_url if r.handle else None, r.in_flight, r.replica.since,
            r.waiting_reason if r.state is S.PENDING and r.waiting_reason else r.replica.reason)
            for r in rev.replicas.values())
        return RevisionStatus(revision_id, summarize_state(rev), replicas, len(rev.queue),
                              rev.desired, rev.last_error)

    async def refresh(self) -> None:
        specs = {s.revision_id: s for s in await self.desired.revisions()}
        self._last_refresh = self.clock.mono()
        for revision_id, spec in specs.items():
            rev = self._revisions.get(revision_id)
            if rev is None or rev.retired:
                self._revisions[revision_id] = RevisionState(spec, RevisionQueue(revision_id, self.settings.queue_limit))
            else:
                rev.spec = spec
        for revision_id, rev in list(self._revisions.items()):
            if revision_id not in specs and not rev.retired:
                self._retire(rev)
        for rev in list(self._revisions.values()):
            self._reconcile(rev)

    # ------------------------------------------------------------- acquire helpers

    async def _revision_for(self, spec: RevisionSpec) -> RevisionState:
        rev = self._revisions.get(spec.revision_id)
        if rev is None or rev.retired:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - e.g. the control plane's database is down
                raise ColdStartFailed(f"cannot read the desired state: {type(exc).__name__}: {exc}") from exc
            rev = self._revisions.get(spec.revision_id)
        if rev is None or rev.retired:
            raise ColdStartFailed(f"revision {spec.revision_id} is not in the desired state")
        return rev

    def _refuse_during_backoff(self, rev: RevisionState) -> None:
        """Right after a failed cold start, answer at once with its reason (503)."""
        now = self.clock.mono()
        if rev.last_error and now < rev.refuse_until and not rev.in_state(*LIVE):
            raise ColdStartFailed(rev.last_error, retry_after_s=max(0.5, rev.refuse_until - now))

    def _retry_after(self, rev: RevisionState) -> float:
        """Retry-After for a wait that timed out: short once the replica is loading."""
        return 2.0 if rev.in_state(S.LOADING) else 5.0

    def _route(self, rev: RevisionState, prefix_key: Optional[str]) -> Optional[ReplicaSlot]:
        ready = rev.in_state(S.READY)
        chosen = choose([Candidate(r.replica_id, r.in_flight) for r in ready], prefix_key)
        if chosen is None:
            return None
        slot = rev.replicas[chosen]
        slot.in_flight += 1
        return slot

    def _lease(self, rev: RevisionState, slot: ReplicaSlot, start: float, cold: bool) -> Lease:
        queue_s = self.clock.mono() - start
        return Lease(base_url=slot.handle.base_url, replica_id=slot.replica_id,
                     revision_id=rev.spec.revision_id, queue_s=queue_s,
                     cold_start=cold_start_timings(slot.replica, queue_s) if cold else None,
                     on_release=lambda lease: self._release_replica(rev, lease.replica_id),
                     on_failed=lambda lease: self._check_soon(rev, lease.replica_id))

    def _release_replica(self, rev: RevisionState, replica_id: str) -> None:
        slot = rev.replicas.get(replica_id)
        rev.last_activity = self.clock.mono()
        if slot is None:
            return
        slot.in_flight = max(0, slot.in_flight - 1)
        if slot.state is S.DRAINING and slot.in_flight == 0:
            self._spawn(self._finish_drain(rev, slot))

    def _check_soon(self, rev: RevisionState, replica_id: str) -> None:
        slot = rev.replicas.get(replica_id)
        if slot is not None and slot.state in (S.READY, S.DRAINING):
            self._spawn(self._check_replica(rev, slot))

    async def _check_replica(self, rev: RevisionState, slot: ReplicaSlot) -> None:
        """After a failed request: a dead or unhealthy process is marked failed."""
        if slot.state not in (S.READY, S.DRAINING) or slot.handle is None:
            return
        reason = slot.handle.exit_reason() if not slot.handle.is_alive() else None
        if reason is None:
            try:
                resp = await self._http.get(f"{slot.handle.base_url}/health", timeout=2.0)
                if resp.status_code != 200:
                    reason = f"unhealthy after a failed request: {resp.status_code} {resp.text[:200]}"
            except httpx.HTTPError as exc:
                await self._wait_exit(slot.handle, 1.0)      # a killed process may not be reaped yet
                reason = (slot.handle.exit_reason() or
                          f"unreachable after a failed request: {type(exc).__name__}")
        if reason and slot.state in (S.READY, S.DRAINING):
            self._fail(rev, slot, reason)

    async def _wait_exit(self, handle: ReplicaHandle, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while handle.is_alive() and loop.time() < deadline:
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------- reconcile

    def _snapshot(self, rev: RevisionState) -> Snapshot:
        spec = rev.spec
        config = ScalingConfig(
            min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
            target_concurrency=spec.target_concurrency, idle_timeout_s=spec.idle_timeout_s,
            scale_down_delay_s=self.settings.scale_down_delay_s,
            target_queued_prompt_tokens=self.settings.target_queued_prompt_tokens)
        ready = rev.in_state(S.READY)
        return Snapshot(now=self.clock.mono(), config=config,
                        in_flight=tuple(r.in_flight for r in ready),
                        queued_requests=len(rev.queue), queued_prompt_tokens=rev.queue.prompt_tokens,
                        last_activity_at=rev.last_activity, ready=len(ready),
                        starting=len(rev.in_state(*STARTING)))

    def _reconcile(self, rev: RevisionState) -> None:
        if rev.retired:                          # no longer deployed: drain everything now
            rev.desired, reason = 0, "revision no longer deployed"
        else:
            decision, rev.policy_state = policy(self._snapshot(rev), rev.policy_state)
            rev.desired, reason = decision.desired, decision.reason
        live = rev.in_state(*STARTING, S.READY)
        if rev.desired > len(live) and self.clock.mono() >= rev.backoff_until:
            for _ in range(rev.desired - len(live)):
                self._new_replica(rev)
        elif rev.desired < len(live):
            for slot in scale_down_order(live)[:len(live) - rev.desired]:
                self._scale_down(rev, slot, reason)

    def _retire(self, rev: RevisionState) -> None:
        rev.retired = True
        rev.queue.fail_all(ColdStartFailed(f"revision {rev.spec.revision_id} is no longer deployed"))

    def _new_replica(self, rev: RevisionState) -> ReplicaSlot:
        replica = Replica(f"rep-{uuid.uuid4().hex[:12]}", rev.spec.revision_id,
                          self.clock.mono(), self.clock.utc())
        slot = ReplicaSlot(replica, rev.spec)
        rev.replicas[replica.replica_id] = slot
        self._publish(slot)
        slot.task = self._spawn(self._cold_start(rev, slot))
        self._prune(rev)
        return slot

    def _scale_down(self, rev: RevisionState, slot: ReplicaSlot, reason: str) -> None:
        if slot.state in STARTING:
            if slot.task:
                slot.task.cancel()
            self._spawn(self._shutdown_replica(slot, reason=f"scaled down while starting: {reason}"))
        elif slot.state is S.READY:
            self._move(slot, S.DRAINING, reason)
            slot.drain_started = self.clock.mono()
            if slot.in_flight == 0:
                self._spawn(self._finish_drain(rev, slot))

    # ------------------------------------------------------------- cold start

    async def _cold_start(self, rev: RevisionState, slot: ReplicaSlot) -> None:
        s = self.settings
        try:
            info = await self._stage(self._model_info(slot.spec.model_uri), s.pull_timeout_s, "inspecting the model")
            await self._wait_for_slots(slot, info, await self._nodes_with_weights(slot.spec.model_uri))
            await self._pull_and_launch(slot)
            await self._stage(self._wait_healthy(slot), s.load_timeout_s, "loading")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes the replica's reason
            self._fail(rev, slot, failure_reason(exc))
            return
        self._move(slot, S.READY)
        rev.last_error = None
        rev.queue.dispatch(lambda w: self._pick_for(rev, w))

    async def _stage(self, work, timeout_s: float, name: str):
        try:
            return await asyncio.wait_for(work, timeout_s)
        except asyncio.TimeoutError:
            raise ColdStartFailed(f"{name} timed out after {timeout_s:g}s") from None

    async def _pull_and_launch(self, slot: ReplicaSlot) -> None:
        """pulling, then loading once the runtime process is started.

        A backend that pulls on its node gets no local folder; its start_replica
        pulls there first (under its own pull timeout), so it runs while pulling.
        """
        slots = self._placed_slots(slot)
        self._move(slot, S.PULLING)
        if getattr(self._backend, "pulls_on_node", False):
            slot.handle = await self._backend.start_replica(slot.spec, slots, None, slot.replica_id)
            self._move(slot, S.LOADING)
            return
        fetch = self.weights.fetch_model(slot.spec.model_uri)
        slot.files = await self._stage(fetch, self.settings.pull_timeout_s, "pulling")
        self._move(slot, S.LOADING)
        slot.handle = await self._backend.start_replica(slot.spec, slots, slot.files.model_dir, slot.replica_id)

    async def _nodes_with_weights(self, model_uri: str) -> FrozenSet[str]:
        """Nodes whose own cache already has every file of the model (empty: no preference)."""
        holding = getattr(self._backend, "nodes_holding", None)
        if holding is None:
            return frozenset()
        try:
            objects = await self.weights.list_model(model_uri)
            nodes = await asyncio.wait_for(holding([entry_key(o) for o in objects]), PREFERENCE_TIMEOUT_S)
            return frozenset(nodes)
        except Exception as exc:  # noqa: BLE001 - only a preference: place without it
            log.warning("cannot tell which nodes hold %s: %s", model_uri, failure_reason(exc))
            return frozenset()

    async def _model_info(self, model_uri: str) -> ModelInfo:
        if model_uri not in self._infos:
            await self.inspect_model(model_uri)
        return self._infos[model_uri]

    async def _wait_for_slots(self, slot: ReplicaSlot, info: ModelInfo, preferred: FrozenSet[str]) -> None:
        request = self._placement_request(info, slot.spec)
        reason = never_fits(request, self._slot_states())
        if reason:
            raise NeverFits(f"can never be placed: {reason}")
        while True:
            decision = place(request, self._slot_states(), preferred)
            if isinstance(decision, Placed):
                self._reserve(slot, decision)
                return
            slot.waiting_reason = decision.reason
            async with self._capacity:
                try:
                    await asyncio.wait_for(self._capacity.wait(), self.settings.tick_s * 4)
                except asyncio.TimeoutError:
                    pass

    async def _wait_healthy(self, slot: ReplicaSlot) -> dict:
        url = f"{slot.handle.base_url}/health"
        while True:
            if not slot.handle.is_alive():
                raise ColdStartFailed(slot.handle.exit_reason() or "runtime process exited while loading")
            try:
                resp = await self._http.get(url, timeout=2.0)
                if resp.status_code == 200:
                    return resp.json()
                if resp.status_code == 500:
                    raise ColdStartFailed(f"runtime failed to load: {resp.json().get('error')}")
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(self.settings.health_poll_s)

    def _pick_for(self, rev: RevisionState, waiter: Waiter) -> Optional[str]:
        picked = self._route(rev, waiter.prefix_key)
        return picked.replica_id if picked else None

    # ------------------------------------------------------------- failure and stop

    def _fail(self, rev: RevisionState, slot: ReplicaSlot, reason: str) -> None:
        if slot.state not in LIVE or slot.stopping:
            return
        log.warning("replica %s of %s failed: %s", slot.replica_id, rev.spec.revision_id, reason)
        crashed_after_ready = slot.replica.entered(S.READY) is not None
        self._move(slot, S.FAILED, reason)
        rev.last_error = reason
        now = self.clock.mono()
        backoff = self._note_failure(rev, slot, crashed_after_ready, now)
        rev.backoff_until = now + backoff
        if not crashed_after_ready:
            rev.refuse_until = rev.backoff_until
        if not rev.in_state(*STARTING, S.READY):
            rev.queue.fail_all(ColdStartFailed(reason, retry_after_s=max(1.0, backoff)))
        self._spawn(self._cleanup(slot))

    def _note_failure(self, rev: RevisionState, slot: ReplicaSlot, after_ready: bool, now: float) -> float:
        """Backoff before the next start: doubles per failure; a first crash of a replica
        that served for a while is replaced at once."""
        ready_at = slot.replica.entered(S.READY)
        if after_ready and ready_at is not None and now - ready_at >= self.settings.crash_backoff_cap_s:
            rev.failures = 0
        rev.failures += 1
        exponent = rev.failures - (2 if after_ready else 1)
        if exponent < 0:
            return 0.0
        return min(self.settings.crash_backoff_cap_s, self.settings.crash_backoff_base_s * 2 ** exponent)

    async def _finish_drain(self, rev: RevisionState, slot: ReplicaSlot) -> None:
        if slot.state is S.DRAINING:
            await self._shutdown_replica(slot)

    async def _shutdown_replica(self, slot: ReplicaSlot, reason: Optional[str] = None) -> None:
        """Stop a live replica (starting, ready or draining) and record it stopped."""
        if slot.task and not slot.task.done() and slot.task is not asyncio.current_task():
            slot.task.cancel()
            await asyncio.gather(slot.task, return_exceptions=True)
        if slot.state is S.READY:
            self._move(slot, S.DRAINING, reason)
        await self._cleanup(slot)
        if slot.state in LIVE:
            self._move(slot, S.STOPPED, reason)

    async def _cleanup(self, slot: ReplicaSlot) -> None:
        handle = slot.handle
        if handle is not None:
            slot.stopping = True         # a Ray handle reads dead before its actor is gone
            try:
                await handle.stop(self.settings.stop_timeout_s)
            finally:
                forget = getattr(self._backend, "forget", None)
                if forget:
                    forget(handle)
        if slot.files is not None:
            self.weights.release(slot.files)
            slot.files = None
        await self._unreserve(slot)

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
        for rev in list(self._revisions.values()):
            self._notice_crashes(rev)
            self._expire_drains(rev)
            self._reconcile(rev)
            if rev.retired and not rev.in_state(*LIVE):
                self._revisions.pop(rev.spec.revision_id, None)

    def _notice_crashes(self, rev: RevisionState) -> None:
        for slot in rev.in_state(S.READY, S.DRAINING):
            if slot.handle is not None and not slot.handle.is_alive():
                self._fail(rev, slot, slot.handle.exit_reason() or "runtime process died")

    def _expire_drains(self, rev: RevisionState) -> None:
        for slot in rev.in_state(S.DRAINING):
            if slot.drain_started and self.clock.mono() - slot.drain_started >= self.settings.drain_timeout_s:
                self._spawn(self._shutdown_replica(slot, reason="drain timed out"))

    # ------------------------------------------------------------- slots

    async def refresh_inventory(self) -> None:
        """Re-read a cluster backend's slots: a node that joined adds its slots (and wakes
        replicas waiting for capacity); a node that left takes its slots away. Replicas
        that ran there fail on their own when the backend sees them die."""
        inventory = getattr(self._backend, "inventory", None)
        self._last_inventory = self.clock.mono()
        if inventory is None:
            return                               # local slots do not change while running
        try:
            fresh = list(await inventory())
        except Exception as exc:  # noqa: BLE001 - keep the last known slots until it answers
            log.warning("cannot read the backend's inventory: %s", failure_reason(exc))
            return
        added, removed = slot_changes(self._slots, fresh)
        self._slots = fresh
        for gone in removed:
            self._reserved.pop(gone.slot_id, None)
        for new in added:
            self._reserved.setdefault(new.slot_id, {})
        if added or removed:
            log.info("inventory: %d slot(s) joined, %d left; %d now", len(added), len(removed), len(fresh))
        if added:
            async with self._capacity:
                self._capacity.notify_all()

    def _placed_slots(self, slot: ReplicaSlot) -> list[Slot]:
        known = {s.slot_id: s for s in self._slots}
        missing = [sid for sid in slot.replica.slot_ids if sid not in known]
        if missing:
            raise ColdStartFailed(f"slot(s) {', '.join(missing)} left the pool before the replica started")
        return [known[sid] for sid in slot.replica.slot_ids]

    def _slot_states(self) -> list[SlotState]:
        return [SlotState(s.slot_id, s.node, s.memory_bytes, reserved_bytes(s, self._reserved[s.slot_id]))
                for s in self._slots]

    def _placement_request(self, info: ModelInfo, resources, engine=None) -> PlacementRequest:
        if isinstance(resources, RevisionSpec):
            gb, count, engine = resources.gpu_memory_gb, resources.gpu_count, resources.engine
        else:
            gb = float(resources.get("gpu_memory_gb") or 0)
            count = int(resources.get("gpu_count") or 1)
            engine = engine if engine is not None else resources.get("engine") or {}
        return request_for(info, gb, count, engine, self.settings.kv_cache_tokens_default,
                           self.settings.memory_overhead_fraction)

    def _reserve(self, slot: ReplicaSlot, placed: Placed) -> None:
        slot.placed, slot.waiting_reason = placed, None
        slot.replica.slot_ids = placed.slot_ids
        for sid in placed.slot_ids:
            self._reserved[sid][slot.replica_id] = placed.bytes_per_slot

    async def _unreserve(self, slot: ReplicaSlot) -> None:
        if slot.placed is None:
            return
        for sid in slot.placed.slot_ids:
            self._reserved.get(sid, {}).pop(slot.replica_id, None)      # its node may have left
        slot.placed = None
        async with self._capacity:
            self._capacity.notify_all()

    # ------------------------------------------------------------- events and tasks

    def _move(self, slot: ReplicaSlot, state: S, reason: Optional[str] = None) -> None:
        slot.replica.move(state, self.clock.mono(), self.clock.utc(), reason)
        self._publish(slot)

    def _publish(self, slot: ReplicaSlot) -> None:
        step = slot.replica.history[-1]
        spec = slot.spec
        self._event_queue.put_nowait(ReplicaEvent(
            replica_id=slot.replica_id, revision_id=spec.revision_id, deployment_id=spec.deployment_id,
            tenant_id=spec.tenant_id, state=step.state.value, at=step.at, gpu_count=spec.gpu_count,
            slot_ids=slot.replica.slot_ids, reason=step.reason))

    async def _emit_events(self) -> None:
        while True:
            event = await self._event_queue.get()
            try:
                await self.events.replica_changed(event)
            except Exception:  # noqa: BLE001 - a sink failure must not stop the pool
                log.exception("replica event sink failed for %s", event)
            finally:
                self._event_queue.task_done()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _prune(self, rev: RevisionState) -> None:
        finished = [r for r in rev.replicas.values() if r.state not in LIVE]
        for old in finished[:-KEEP_FINISHED]:
            rev.replicas.pop(old.replica_id, None)


# ----------------------------------------------------------------- pure helpers

def scale_down_order(live: list[ReplicaSlot]) -> list[ReplicaSlot]:
    """Victims first: not yet placed, then other starting (newest first), then ready by load."""
    def key(r: ReplicaSlot):
        if r.state is S.PENDING and r.placed is None:
            return (0, -r.replica.created_mono)
        if r.state in STARTING:
            return (1, -r.replica.created_mono)
        return (2, r.in_flight, -r.replica.created_mono)
    return sorted(live, key=key)


def reserved_bytes(slot: Slot, held: Mapping[str, int]) -> int:
    """Memory taken on a slot; an exclusive slot (a whole Ray GPU) is full once anyone holds it."""
    if slot.exclusive and held:
        return slot.memory_bytes
    return sum(held.values())


def slot_changes(current: Sequence[Slot], fresh: Sequence[Slot]) -> tuple[list[Slot], list[Slot]]:
    """(slots in fresh but not current, slots in current but not fresh), by slot id."""
    before, after = {s.slot_id for s in current}, {s.slot_id for s in fresh}
    return [s for s in fresh if s.slot_id not in before], [s for s in current if s.slot_id not in after]


def cold_start_timings(replica: Replica, queue_s: float) -> ColdStartTimings:
    ready_at = replica.entered(S.READY) or replica.created_mono
    return ColdStartTimings(queue_s=queue_s, placement_s=replica.seconds_in(S.PENDING),
                            download_s=replica.seconds_in(S.PULLING), load_s=replica.seconds_in(S.LOADING),
                            total_s=ready_at - replica.created_mono)


def failure_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    if not isinstance(exc, (ColdStartFailed, ModelUnavailable, NeverFits)):
        reason = f"{type(exc).__name__}: {reason}"
    return reason


def summarize_state(rev: RevisionState) -> str:
    states = {r.state for r in rev.replicas.values()}
    if S.READY in states:
        return "ready"
    if any(r.state is S.PENDING and r.waiting_reason for r in rev.replicas.values()):
        return "waiting_for_capacity"
    if states & STARTING:
        return "starting"
    if S.DRAINING in states:
        return "draining"
    if rev.last_error:
        return "failed"
    return "scaled_to_zero"
