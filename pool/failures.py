"""A replica's failure: noticed (a dead process, a failed request's health check),
recorded (FAILED, the revision's last error and crash backoff) and cleaned up.

A replica the pool is already stopping is never failed: its process dying is the stop.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx

from pool.api import ColdStartFailed
from pool.background import Spawn
from pool.backoff import BackoffConfig, Failure, after_failure
from pool.clock import Clock
from pool.health import why_unhealthy
from pool.registry import ManagedReplica, RevisionState
from pool.replica import LIVE, STARTING, ReplicaState
from pool.replica_events import ReplicaEvents
from pool.stopping import ReplicaStopper

log = logging.getLogger(__name__)
READY, DRAINING, SLEEPING = ReplicaState.READY, ReplicaState.DRAINING, ReplicaState.SLEEPING


@dataclass(frozen=True)
class ReplicaFailures:
    events: ReplicaEvents
    clock: Clock
    backoff: BackoffConfig
    stopper: ReplicaStopper
    http: httpx.AsyncClient
    spawn: Spawn

    def fail(self, rev: RevisionState, managed: ManagedReplica, reason: str) -> None:
        """FAILED with its reason; the revision backs off, and its waiting requests fail
        when no other replica is starting or ready to take them."""
        if managed.state not in LIVE or managed.stopping:
            return
        log.warning("replica %s of %s failed: %s", managed.replica_id, rev.spec.revision_id, reason)
        ready_at = managed.replica.entered(READY)
        self.events.move(managed, ReplicaState.FAILED, reason)
        rev.last_error = reason
        rev.backoff, delay = after_failure(rev.backoff, Failure(self.clock.mono(), ready_at), self.backoff)
        if not rev.in_state(*STARTING, READY):
            rev.queue.fail_all(ColdStartFailed(reason, retry_after_s=max(1.0, delay)))
        self.spawn(self.stopper.cleanup(managed))

    def notice_crashes(self, rev: RevisionState) -> None:
        for managed in rev.in_state(READY, DRAINING, SLEEPING):
            if managed.handle is not None and not managed.handle.is_alive():
                self.fail(rev, managed, managed.handle.exit_reason() or "runtime process died")

    def check_soon(self, rev: RevisionState, replica_id: str) -> None:
        """A request failed on the replica: check it, routing nothing new to it meanwhile."""
        managed = rev.replicas.get(replica_id)
        if managed is not None and managed.state in (READY, DRAINING) and not managed.checking:
            managed.check = self.spawn(self._check(rev, managed))

    async def _check(self, rev: RevisionState, managed: ManagedReplica) -> None:
        if managed.state not in (READY, DRAINING) or managed.handle is None:
            return
        reason = await why_unhealthy(managed.handle, self.http)
        if reason and managed.state in (READY, DRAINING):
            self.fail(rev, managed, reason)
        elif not reason:       # cleared (this task is not done yet): queued requests may go to it
            managed.check = None
            rev.queue.dispatch(lambda waiter: rev.route(waiter.prefix_key))
