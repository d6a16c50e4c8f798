"""ReplicaLease: the pool's `pool.api.Lease`, one request's hold on a ready replica.

An async context manager that releases on exit. The manager passes in what
release and failure do (count the replica out, probe it), so the lease holds
no reference to the pool's state.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

from pool.api import AdapterLoadTimings, ColdStartTimings


class ReplicaLease:
    def __init__(self, *, base_url: str, replica_id: str, revision_id: str, queue_s: float,
                 cold_start: Optional[ColdStartTimings], headers: Mapping[str, str],
                 on_release: Callable[[ReplicaLease], None], on_failed: Callable[[ReplicaLease], None]):
        self.base_url = base_url
        self.headers = headers                  # the replica's secret: sent on every call to it
        self.replica_id = replica_id
        self.revision_id = revision_id          # also the model name the replica serves
        self.queue_s = queue_s
        self.cold_start = cold_start
        self.adapter_load: Optional[AdapterLoadTimings] = None   # set when it waited for one
        self.failed = False
        self.released = False
        self._on_release = on_release
        self._on_failed = on_failed
        self._also_on_release: list[Callable[[], None]] = []

    def release(self) -> None:
        """Give the replica back; idempotent (only the first call counts)."""
        if not self.released:
            self.released = True
            for done in self._also_on_release:
                done()
            self._on_release(self)

    def on_release(self, done: Callable[[], None]) -> None:
        """Run `done` too when the lease is released (an adapter it holds in use)."""
        self._also_on_release.append(done)

    def mark_failed(self) -> None:
        """The replica broke mid-request: the pool checks it now (routing no new request
        to it until the check clears it) and replaces it if dead."""
        if not self.failed:
            self.failed = True
            self._on_failed(self)

    async def __aenter__(self) -> ReplicaLease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ReplicaLease({self.replica_id} at {self.base_url}, queue_s={self.queue_s:.3f})"
