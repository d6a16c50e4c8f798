"""Runs asynchronous function calls and keeps them in Postgres, so a tenant's call and its
answer outlive the control plane that accepted it (the rules: controlplane.gateway.async_call_rules).

`accept` commits the call's `running` row before the client hears 202, then runs the
call in a task of its own and records its answer. Postgres down at acceptance is an
outage the app answers 503 with Retry-After; down when a call ends, the answer is
written again every `retry_s` until it lands or its retention is over (reads are 503
meanwhile). `start`, at the control plane's start, marks the calls still `running` as
failed: the control plane is a single instance, so they were cut by its restart.
Calls in flight are capped per tenant (its quota's `max_async_calls`) and in all, each
refusal TooManyInFlight (429): one tenant's flood leaves room for every other's. `stop`
cancels the calls in flight, which the next start marks the same way. Expired rows are
deleted lazily, one bounded batch at a time, when a call is accepted.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import datetime
from typing import Any, Awaitable, Callable, Optional

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.gateway.async_call_rules import (SweepState, StoredCall, cut_by_restart, expired_before,
                                         finished, is_expired, new_call, sweep_due)
from controlplane.store.tables import utcnow
from controlplane.store import function_calls as store
from controlplane.store.failures import is_outage
from wire.errors import error_body

log = logging.getLogger("thawpool.async_calls")
# The call itself: the status and JSON body a synchronous call would have answered.
Work = Callable[[], Awaitable[tuple[int, dict[str, Any]]]]
SWEEP_EVERY_S = 60.0
SWEEP_BATCH = 1000
MAX_IN_FLIGHT = 10_000       # each holds its request's body in memory until it ends


class TooManyInFlight(Exception):
    """Refused before anything is stored; `param` names the limit."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class AsyncCalls:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], retention_s: float, *,
                 clock: Callable[[], datetime] = utcnow, retry_s: float = 1.0,
                 max_in_flight: int = MAX_IN_FLIGHT):
        self.sessions = sessions
        self.retention_s = retention_s
        self.clock = clock
        self.retry_s = retry_s
        self.max_in_flight = max_in_flight
        self._sweep = SweepState()
        self._tasks: set[asyncio.Task[None]] = set()
        self._by_tenant: Counter[str] = Counter()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def start(self) -> int:
        """Fails the calls a previous control plane left running; how many it found."""
        status, body = cut_by_restart()
        async with self.sessions.begin() as session:
            cut = await store.fail_running(session, status, body, self.clock())
        if cut:
            log.warning("%d asynchronous function calls were cut by a restart: marked failed", cut)
        return cut

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.wait()

    async def wait(self) -> None:
        """Until every call in flight has ended and its answer was recorded (or given up)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def in_flight_for(self, tenant_id: str) -> int:
        return self._by_tenant[tenant_id]

    async def accept(self, tenant_id: str, deployment: str, work: Work, *,
                     tenant_limit: Optional[int] = None) -> StoredCall:
        """`tenant_limit`: the tenant's calls in flight at once (None: only the global cap)."""
        self._admit(tenant_id, tenant_limit)
        self._by_tenant[tenant_id] += 1        # before any await: the count is the check's
        try:
            call = new_call(tenant_id, deployment, self.clock())
            async with self.sessions.begin() as session:
                await store.add(session, call)
                await self._sweep_if_due(session, call.created_at)
        except BaseException:
            self._release(tenant_id)
            raise
        task = asyncio.create_task(self._run(call, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._release(tenant_id))
        return call

    def _admit(self, tenant_id: str, tenant_limit: Optional[int]) -> None:
        if tenant_limit is not None and self._by_tenant[tenant_id] >= tenant_limit:
            raise TooManyInFlight("max_async_calls", f"this tenant has {tenant_limit} "
                                  "asynchronous calls running, its limit (max_async_calls); "
                                  "retry when one has ended")
        if self.in_flight >= self.max_in_flight:
            raise TooManyInFlight("max_in_flight",
                                  f"{self.max_in_flight} asynchronous calls are running")

    def _release(self, tenant_id: str) -> None:
        self._by_tenant[tenant_id] -= 1
        if self._by_tenant[tenant_id] <= 0:
            del self._by_tenant[tenant_id]

    async def get(self, tenant_id: str, call_id: str) -> Optional[StoredCall]:
        """The tenant's own call until its retention is over; None otherwise."""
        async with self.sessions() as session:
            call = await store.find(session, tenant_id, call_id)
        return None if call is None or is_expired(call, self.clock(), self.retention_s) else call

    async def _sweep_if_due(self, session: AsyncSession, now: datetime) -> None:
        if not sweep_due(self._sweep, now, SWEEP_EVERY_S):
            return
        self._sweep = SweepState(now)          # before the await: one sweep at a time is enough
        deleted = await store.delete_expired(session, expired_before(now, self.retention_s),
                                             SWEEP_BATCH)
        self._sweep = SweepState(now, full=deleted == SWEEP_BATCH)

    async def _run(self, call: StoredCall, work: Work) -> None:
        try:
            status, body = await work()
        except Exception as exc:  # noqa: BLE001 - the call must end, as a sync call's 500 would
            log.error("function call %s failed", call.id, exc_info=exc)
            status, body = 500, error_body("internal error", 500)
        await self._record(finished(call, status, body, self.clock()))

    async def _record(self, done: StoredCall) -> None:
        while True:
            try:
                async with self.sessions.begin() as session:
                    await store.finish(session, done)
                return
            except Exception as exc:  # noqa: BLE001 - an outage is retried, the rest logged
                if not is_outage(exc) or is_expired(done, self.clock(), self.retention_s):
                    log.error("the answer of function call %s was not stored", done.id,
                              exc_info=exc)
                    return
            await asyncio.sleep(self.retry_s)
