"""What the pool knows: every revision it serves, with its replicas and their holdings.

A `RevisionState` is one revision of the desired state, its activator queue,
its replicas and what the autoscaler and the crash backoff remember of it. A
`ManagedReplica` is one replica's lifecycle record (pool.replica.Replica)
plus what the manager holds for it: the backend's handle, the weights it
pins (the model's, and a draft model's), the slots it reserves or why it
waits for them, its cold-start task. Revisions that left the desired state
stay, retired, until their replicas have stopped. Tenants are seen through
their revisions: their quotas and their waiting requests.

The functions at the bottom are pure views of these records: the autoscaler's
snapshot, the scale-down order, the status page and who holds slots (the
heartbeat).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Iterable, Optional

from pool.activator import RevisionQueue
from pool.adapter_holdings import AdapterHoldings
from pool.admission import WaitReason
from pool.api import ColdStartFailed, ReplicaStatus, RevisionSpec, RevisionStatus, TenantQuota
from pool.autoscaler import PolicyState, ScalingConfig, ScalingSnapshot, victim_rank
from pool.backends.base import ReplicaHandle
from pool.backoff import Backoff
from pool.expected_load import InFlightAverage, replica_load
from pool.keep_alive import IdleHistogram, IdleWindow, learn
from pool.placement import Placed
from pool.weights.prefetch import Prefetched
from pool.replica import LIVE, STARTING, Replica, ReplicaState
from pool.router import Candidate, choose
from pool.settings import PoolSettings
from pool.weights.store import ModelFiles

KEEP_FINISHED = 8                       # stopped/failed replicas kept for status pages


@dataclass(frozen=True)
class Asleep:
    """A sleeping replica: the node its process is on, the slots its process is bound to
    (a wake must have the same ones back), and the host memory its weights take."""
    node: str
    slot_ids: tuple[str, ...]
    bytes_per_slot: int
    host_bytes: int
    since: float                        # monotonic


@dataclass
class ManagedReplica:
    """A replica plus what the manager holds for it."""
    replica: Replica
    spec: RevisionSpec
    in_flight: int = 0
    handle: Optional[ReplicaHandle] = None
    files: tuple[ModelFiles, ...] = ()  # pinned in the weight cache while it lives
    placed: Optional[Placed] = None
    waiting: Optional[WaitReason] = None    # why it is not placed yet
    task: Optional[asyncio.Task[None]] = None
    drain_started: Optional[float] = None
    stopping: bool = False              # being stopped on purpose: a dead handle is no crash
    final_tokens: Optional[tuple[int, int]] = None   # (prompt, completion) it served, read as it stops
    drain_to: ReplicaState = ReplicaState.STOPPED    # where its drain ends: stopped, or asleep
    weight_bytes: int = 0               # its weights' size (placement's estimate): host memory asleep
    asleep: Optional[Asleep] = None     # while sleeping: where, and the slots it gave back
    # a request failed on it and its health is being checked: no new request goes to it
    # until the check clears it (a crashed replica's socket closes before its process is
    # seen dead: a request routed meanwhile would be refused)
    check: Optional[asyncio.Task[None]] = None
    adapters: AdapterHoldings = field(default_factory=AdapterHoldings)   # the LoRA adapters it was given
    expected_load: float = 0.0          # placement packs by it (pool/expected_load.py)

    @property
    def checking(self) -> bool:
        return self.check is not None and not self.check.done()

    @property
    def state(self) -> ReplicaState:
        return self.replica.state

    @property
    def replica_id(self) -> str:
        return self.replica.replica_id


@dataclass
class RevisionState:
    spec: RevisionSpec
    queue: RevisionQueue
    replicas: dict[str, ManagedReplica] = field(default_factory=dict)
    policy_state: PolicyState = PolicyState()
    backoff: Backoff = Backoff()
    last_activity: Optional[float] = None
    last_error: Optional[str] = None
    desired: int = 0
    retired: bool = False
    scale_ups: int = 0                  # scale-up decisions so far: each one prefetches again
    prefetched: Optional[Prefetched] = None   # its latest prefetch (pool/weights/prefetch.py)
    idle_times: IdleHistogram = field(default_factory=IdleHistogram)   # pool/keep_alive.py
    in_flight_avg: InFlightAverage = field(default_factory=InFlightAverage)   # pool/expected_load.py

    def note_in_flight(self, now: float) -> None:
        """Its requests in flight or waiting changed: the average placement reads moves."""
        waiting = len(self.queue) if self.queue is not None else 0
        self.in_flight_avg.update(now, sum(r.in_flight for r in self.replicas.values()) + waiting)

    def next_replica_load(self, now: float) -> float:
        """What one more replica is expected to use of its GPUs, with the replicas it has."""
        live = sum(1 for r in self.replicas.values() if r.state in LIVE and r.state is not ReplicaState.SLEEPING)
        return replica_load(self.in_flight_avg.average(now), self.spec.target_concurrency, live + 1)

    def arrived(self, now: float) -> None:
        """A request came: the idle spell it ends (none in flight or waiting) is counted."""
        idle = self.last_activity is not None and not len(self.queue) \
            and not any(r.in_flight for r in self.replicas.values())
        if idle and self.last_activity is not None:
            self.idle_times.add(now - self.last_activity)
        self.last_activity = now

    def in_state(self, *states: ReplicaState) -> list[ManagedReplica]:
        return [r for r in self.replicas.values() if r.state in states]

    def retire(self) -> None:
        """No longer deployed: waiting requests fail now, replicas drain on the next reconcile."""
        self.retired = True
        self.queue.fail_all(ColdStartFailed(f"revision {self.spec.revision_id} is no longer deployed"))

    def route(self, prefix_key: Optional[str], adapter: Optional[str] = None) -> Optional[str]:
        """The ready replica that takes a request, counted in flight from now on."""
        chosen = choose([Candidate(r.replica_id, r.in_flight, adapter is not None and r.adapters.holds(adapter))
                         for r in self.in_state(ReplicaState.READY) if not r.checking],
                        prefix_key, adapter=adapter)
        if chosen is not None:
            self.replicas[chosen].in_flight += 1
        return chosen

    async def route_after_checks(self, prefix_key: Optional[str],
                                 adapter: Optional[str] = None) -> Optional[str]:
        """When the only ready replicas are being checked after a failed request: their
        verdict first (a few seconds at most), then the route; a replica found dead has
        been failed by then, so the request queues for its replacement."""
        checks = [r.check for r in self.in_state(ReplicaState.READY) if r.checking and r.check is not None]
        if not checks:
            return None
        await asyncio.wait(checks)
        return self.route(prefix_key, adapter)

    def add(self, managed: ManagedReplica) -> None:
        """Track a new replica; forget the oldest finished ones beyond KEEP_FINISHED."""
        self.replicas[managed.replica_id] = managed
        finished = [r for r in self.replicas.values() if r.state not in LIVE]
        for old in finished[:-KEEP_FINISHED]:
            self.replicas.pop(old.replica_id, None)


class Registry:
    """Revisions by id, kept in step with the desired state."""

    def __init__(self, queue_limit: int):
        self.queue_limit = queue_limit
        self._revisions: dict[str, RevisionState] = {}

    def get(self, revision_id: str) -> Optional[RevisionState]:
        """The revision, retired or not."""
        return self._revisions.get(revision_id)

    def deployed(self, revision_id: str) -> Optional[RevisionState]:
        rev = self._revisions.get(revision_id)
        return rev if rev is not None and not rev.retired else None

    def all(self) -> list[RevisionState]:
        return list(self._revisions.values())

    def sync(self, specs: Iterable[RevisionSpec]) -> None:
        """New revisions are added, known ones take their new spec, missing ones retire.
        A revision deployed again after it retired starts with a fresh record."""
        wanted = {s.revision_id: s for s in specs}
        for revision_id, spec in wanted.items():
            rev = self.deployed(revision_id)
            if rev is None:
                self._revisions[revision_id] = RevisionState(spec, RevisionQueue(revision_id, self.queue_limit))
            else:
                rev.spec = spec
        for revision_id, rev in list(self._revisions.items()):
            if revision_id not in wanted and not rev.retired:
                rev.retire()

    def drop_finished(self) -> None:
        """Forget retired revisions once none of their replicas is live."""
        for rev in self.all():
            if rev.retired and not rev.in_state(*LIVE):
                self._revisions.pop(rev.spec.revision_id, None)

    def replica(self, replica_id: str) -> Optional[ManagedReplica]:
        return next((rev.replicas[replica_id] for rev in self._revisions.values()
                     if replica_id in rev.replicas), None)

    def quotas(self) -> dict[str, TenantQuota]:
        """Each tenant's quota, as its deployed revisions carry it."""
        return {rev.spec.tenant_id: rev.spec.quota for rev in self.all() if not rev.retired}

    def queued_requests(self, tenant_id: str) -> int:
        """Requests of one tenant waiting for a replica, across its revisions."""
        return sum(len(rev.queue) for rev in self.all() if rev.spec.tenant_id == tenant_id)


# ----------------------------------------------------------------- pure views

def scaling_snapshot(rev: RevisionState, now: float, settings: PoolSettings) -> ScalingSnapshot:
    """What the autoscaler sees of a revision at `now` (with a keep-alive window learned from
    its idle times when the pool's `keep_alive` is "learned")."""
    spec = rev.spec
    config = ScalingConfig(
        min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
        target_concurrency=spec.target_concurrency, idle_timeout_s=spec.idle_timeout_s,
        scale_down_delay_s=settings.scale_down_delay_s,
        target_queued_prompt_tokens=settings.target_queued_prompt_tokens,
        sleep_timeout_s=spec.sleep_timeout_s, adapter_slots=int(spec.engine.get("max_loras") or 0))
    ready = rev.in_state(ReplicaState.READY)
    return ScalingSnapshot(now=now, config=config, in_flight=tuple(r.in_flight for r in ready),
                    queued_requests=len(rev.queue), queued_prompt_tokens=rev.queue.prompt_tokens,
                    last_activity_at=rev.last_activity, ready=len(ready),
                    starting=len(rev.in_state(*STARTING, ReplicaState.WAKING)),
                    asleep=tuple((r.replica_id, r.asleep.since) for r in rev.replicas.values()
                                 if r.state is ReplicaState.SLEEPING and r.asleep is not None),
                    adapters_in_use=len({name for r in ready for name in r.adapters.users}),
                    idle_window=learned_window(rev, settings))


def learned_window(rev: RevisionState, settings: PoolSettings) -> Optional[IdleWindow]:
    """The keep-alive window its idle times teach, when the pool's keep_alive is "learned"."""
    return learn(rev.idle_times) if settings.keep_alive == "learned" else None


def scale_down_order(live: list[ManagedReplica]) -> list[ManagedReplica]:
    """Victims first (pool.autoscaler.victim_rank)."""
    return sorted(live, key=lambda r: victim_rank(r.state is ReplicaState.PENDING and r.placed is None,
                                                  r.state in STARTING, r.in_flight, r.replica.created_mono))


def weight_keys(rev: RevisionState) -> tuple[str, ...]:
    """The cache entries of the revision's weights, as its latest prefetch filled them or,
    without one, as a live replica pinned them; empty when neither is known."""
    if rev.prefetched is not None and rev.prefetched.keys:
        return rev.prefetched.keys
    pinned = next((r.files for r in rev.replicas.values() if r.state in LIVE and r.files), ())
    return tuple(key for files in pinned for key in files.keys)


def revision_status(rev: RevisionState, weights_cached: bool = False) -> RevisionStatus:
    replicas = tuple(ReplicaStatus(
        r.replica_id, r.state.value, r.replica.slot_ids,
        r.handle.base_url if r.handle else None, r.in_flight, r.replica.since,
        r.waiting.reason if r.state is ReplicaState.PENDING and r.waiting else r.replica.reason)
        for r in rev.replicas.values())
    return RevisionStatus(rev.spec.revision_id, summarize_state(rev), replicas, len(rev.queue),
                          rev.desired, rev.last_error, weights_cached,
                          rev.prefetched.error if rev.prefetched is not None else None)


def summarize_state(rev: RevisionState) -> str:
    states = {r.state for r in rev.replicas.values()}
    if ReplicaState.READY in states:
        return "ready"
    if ReplicaState.WAKING in states:
        return "waking"
    if waits(rev):
        return "waiting_for_capacity"
    if states & STARTING:
        return "starting"
    if ReplicaState.DRAINING in states:
        return "draining"
    if ReplicaState.SLEEPING in states:
        return "sleeping"
    if rev.last_error:
        return "failed"
    return "scaled_to_zero"


def holding_slots(revisions: Iterable[RevisionState]) -> list[ManagedReplica]:
    """Live replicas that hold slots: placed (the event that carried their slot_ids was
    published when they were) and not yet stopped or failed; a sleeper holds none. What a
    heartbeat lists."""
    return [r for rev in revisions for r in rev.replicas.values()
            if r.state in LIVE and r.replica.slot_ids]


def waits(rev: RevisionState) -> list[WaitReason]:
    """Why each replica of the revision that has no slots yet waits for them."""
    return [r.waiting for r in rev.replicas.values() if r.state is ReplicaState.PENDING and r.waiting]
