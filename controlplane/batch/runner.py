"""The batch runner: one background loop that claims due lines and runs each through the
gateway's own path (resolve, validate, admit, acquire, send, relay, meter:
controlplane.gateway.llm), on capacity interactive traffic leaves idle
(controlplane.batch.rules.spare_slots), and writes a batch's output and error files
once all its lines have ended.

Exactly once, across a SIGKILL: a line is claimed (running) in Postgres before it is
sent; its result and its end are one statement; its invocation id and request id are
derived from (batch id, line number), so a line a killed control plane left running is
run again at the next start (`start` puts it back) under the same ids: metering's
`ON CONFLICT (invocation_id) DO NOTHING` keeps its first usage row, and its answer is
stored once. The control plane is one instance (as for asynchronous function calls):
several on one database would split the lines (SKIP LOCKED) but must not reset each
other's running lines at start.

Files are written under ids derived from the batch id, so finalizing again after a
kill rewrites the same objects and keeps the same rows.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import uuid
from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Any, Callable, Optional

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.batch.files import OUTPUT_PURPOSE, BatchFiles
from controlplane.batch.input_lines import gateway_path
from controlplane.batch.pricing import line_pricing
from controlplane.batch.results import (CANCELLED, EXPIRED, FAILED, IN_ERROR_FILE, SUCCEEDED,
                                        error_line, invocation_id, output_line, request_id)
from controlplane.batch.rules import BatchState, Capacity, Fail, after_refusal, next_step, spare_slots
from controlplane.errors import REFUSALS, ApiError, api_error_for
from controlplane.gateway.answer_shape import ChatShape
from controlplane.gateway.llm import Gateway, RouteTarget
from controlplane.lookups.service import Lookups
from controlplane.store import batches as store
from controlplane.store.errors import NotFound
from controlplane.store.failures import is_outage
from controlplane.store.tables import Batch, utcnow
from controlplane.store.tenants import Principal
from pool.api import Pool
from wire.errors import message_of
from wire.priority import BATCH_PRIORITY
from wire.request_id import Message

log = logging.getLogger("thawpool.batch")
Group = tuple[str, str]                  # (tenant id, model)
FILES_NAMESPACE = uuid.UUID("0b5a3f8e-93c4-4c5e-bb1e-2f6f8d1c7a40")


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    poll_s: float = 1.0                  # a round at least this often (and after each line)
    max_in_flight: int = 64              # lines running at once, over all batches
    max_attempts: int = 5
    retry_s: float = 2.0                 # the first retry's wait; doubled per attempt
    price_discount: Decimal = Decimal("0.5")


class BatchRunner:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], gateway: Gateway,
                 lookups: Lookups, pool: Pool, files: BatchFiles, config: RunnerConfig, *,
                 clock: Callable[[], datetime] = utcnow):
        self.sessions, self.gateway, self.lookups, self.pool = sessions, gateway, lookups, pool
        self.files, self.config, self.clock = files, config, clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: Counter[Group] = Counter()
        self._wake = asyncio.Event()
        self._loop: Optional[asyncio.Task[None]] = None

    async def start(self) -> int:
        """Puts back the lines a previous control plane left running; how many."""
        async with self.sessions.begin() as session:
            reset = await store.reset_running(session)
        if reset:
            log.warning("%d batch lines were cut by a restart: run again", reset)
        self._loop = asyncio.create_task(self._run_loop(), name="batch runner")
        return reset

    async def stop(self) -> None:
        """Lines in flight are cancelled: still running in Postgres, the next start runs them."""
        for task in [*self._tasks, *([self._loop] if self._loop else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._loop] if self._loop else []),
                             return_exceptions=True)

    def wake(self) -> None:
        """A round now (a batch was created or cancelled, a line ended)."""
        self._wake.set()

    async def _run_loop(self) -> None:
        while True:
            try:
                await self.round()
            except Exception as exc:  # noqa: BLE001 - the next round may succeed
                log.warning("batch round failed: %r", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.poll_s)
            self._wake.clear()

    async def round(self) -> None:
        """Batches whose lines have all ended are finalized; due lines are started."""
        now = self.clock()
        async with self.sessions() as session:
            open_batches = await store.open_batches(session)
            groups = await store.pending_models(session, now)
        for entry in open_batches:
            try:
                await self._advance(entry, now)
            except Exception as exc:  # noqa: BLE001 - S3 away: the next round finalizes it
                log.warning("batch %s not advanced: %r", entry.batch.id, exc)
        for group in groups:
            await self._fill(group, now)

    # ------------------------------------------------------------ batches

    async def _advance(self, entry: store.OpenBatch, now: datetime) -> None:
        batch = entry.batch
        step = next_step(BatchState(batch.status, batch.expires_at, entry.pending, entry.running), now)
        if step.end_pending_as is not None:
            async with self.sessions.begin() as session:
                await store.end_pending(session, batch.id, step.end_pending_as)
        if step.final_status is not None:
            await self._finalize(batch, step.final_status, now)

    async def _finalize(self, batch: Batch, status: str, now: datetime) -> None:
        """The output and error files, one line per request in input order, then the end."""
        async with self.sessions() as session:
            lines = await store.lines_of(session, batch.id)
        output = [x.result or "" for x in lines if x.status == SUCCEEDED]
        errors = [x.result or _unrun_line(batch.id, x.line, x.custom_id, x.status)
                  for x in lines if x.status in IN_ERROR_FILE]
        output_id = await self._write(batch, "output", output)
        error_id = await self._write(batch, "error", errors)
        async with self.sessions.begin() as session:
            await store.end_batch(session, batch.id, status, output_id, error_id, now)
        log.info("batch %s %s: %d answered, %d in its error file", batch.id, status,
                 len(output), len(errors))

    async def _write(self, batch: Batch, kind: str, lines: list[str]) -> Optional[str]:
        if not lines:
            return None
        file_id = f"file-{uuid.uuid5(FILES_NAMESPACE, f'{batch.id}/{kind}').hex}"
        data = ("\n".join(lines) + "\n").encode()
        await self.files.write(batch.tenant_id, file_id, f"{batch.id}_{kind}.jsonl",
                               OUTPUT_PURPOSE, data)
        return file_id

    # ------------------------------------------------------------ lines

    async def _fill(self, group: Group, now: datetime) -> None:
        budget = min(self.config.max_in_flight - len(self._tasks), spare_slots(await self._capacity(group)))
        if budget <= 0:
            return
        async with self.sessions.begin() as session:
            claimed = await store.claim(session, group[0], group[1], budget, now)
        for line in claimed:
            self._in_flight[group] += 1
            task = asyncio.create_task(self._run_line(line))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._line_done, group))

    def _line_done(self, group: Group, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        self._in_flight[group] -= 1
        if self._in_flight[group] <= 0:
            del self._in_flight[group]
        self.wake()

    async def _capacity(self, group: Group) -> Capacity:
        """The deployment's ready replicas as the pool sees them; one gone (deleted since
        the batch was created) takes lines, which then fail as a call would (404)."""
        try:
            resolved = await self.lookups.model(*group)
        except NotFound:
            return Capacity(1, 0, self.config.max_in_flight, self._in_flight[group])
        replicas = [r for rev in resolved.revisions
                    for r in self.pool.revision_status(rev.id).replicas if r.state == "ready"]
        return Capacity(len(replicas), sum(r.in_flight for r in replicas),
                        resolved.deployment.target_concurrency, self._in_flight[group])

    async def _run_line(self, line: store.Claimed) -> None:
        async with self.sessions() as session:
            batch = await store.find_by_id(session, line.batch_id)
        if batch is None:            # gone with its tenant
            return
        try:
            async with self.sessions() as session:
                principal = await store.principal_of(session, batch)
            status, payload = await self._call(batch, principal, line)
        except REFUSALS as exc:
            refused = api_error_for(exc)
            status, payload = refused.status, refused.body()
        except Exception as exc:  # noqa: BLE001 - a line fails; the batch goes on
            log.error("batch %s line %d failed", batch.id, line.line, exc_info=exc)
            status, payload = 500, ApiError(500, "internal error").body()
        await self._record(batch, line, status, payload)

    async def _call(self, batch: Batch, principal: Principal,
                    line: store.Claimed) -> tuple[int, Any]:
        """The line as the gateway runs a unary call; its invocation id the line's own."""
        gateway, endpoint = self.gateway, gateway_path(batch.endpoint)
        body, rid = json.loads(line.body), request_id(batch.id, line.line)
        target = self._priced(await gateway.resolve(principal, body, rid), batch)
        invocation = gateway.validate(endpoint, body, target)
        admission = gateway.admit(principal, target, invocation)
        hold = await gateway.reserve(principal, target, invocation, admission,       # budgets
                                     invocation_id(batch.id, line.line))
        try:
            call = await gateway.acquire(principal, target, invocation, rid, endpoint, admission,
                                         {"batch_id": batch.id}, priority=BATCH_PRIORITY,
                                         invocation_id=hold.invocation_id)
        except BaseException:
            await gateway.release_budgets(hold)
            raise
        call.journaled = False       # a line cut by a kill runs again, billed by its answer
        try:
            upstream = await gateway.send(call, body)    # a failure is metered under an id of its own
        except BaseException:
            await gateway.release_budgets(hold)
            raise
        try:
            response, outcome = await gateway.relay_unary(call, upstream, _never_disconnects,
                                                          ChatShape(target.model_name))
        finally:
            gateway.release(call)
        if outcome.status != "ok":    # the line runs again or fails: the line's id is its answer's
            gateway.give_back_id(call)
        await gateway.meter(call, outcome)
        if outcome.status != "ok":
            await gateway.release_budgets(hold)
        return response.status_code, json.loads(bytes(response.body))

    def _priced(self, target: RouteTarget, batch: Batch) -> RouteTarget:
        """The batch price in effect when the batch was created."""
        where = (batch.tenant_id, target.deployment.id, batch.created_at,
                 target.adapter.id if target.adapter is not None else None)
        return dataclasses.replace(target, pricing=line_pricing(
            self.lookups.batch_pricing(*where), self.lookups.pricing(*where), self.config.price_discount))

    async def _record(self, batch: Batch, line: store.Claimed, status: int, payload: Any) -> None:
        """Written again every retry_s while Postgres is away (the line stays running
        meanwhile; a restart runs it again, billed once)."""
        while True:
            try:
                await self._store(batch, line, status, payload)
                return
            except Exception as exc:  # noqa: BLE001 - an outage is retried, the rest logged
                if not is_outage(exc):
                    log.error("batch %s line %d: its answer was not stored", batch.id, line.line,
                              exc_info=exc)
                    return
            await asyncio.sleep(self.config.retry_s)

    async def _store(self, batch: Batch, line: store.Claimed, status: int, payload: Any) -> None:
        """The line's answer and its end in one statement; a transient refusal puts it back."""
        now = self.clock()
        async with self.sessions.begin() as session:
            if status == 200:
                await store.finish_line(session, batch.id, line.line, SUCCEEDED,
                                        output_line(batch.id, line.line, line.custom_id, 200, payload))
                return
            error = payload.get("error") if isinstance(payload, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            decided = after_refusal(status, code if isinstance(code, str) else None,
                                    message_of(json.dumps(payload).encode()), line.attempts,
                                    self.config.max_attempts, now, self.config.retry_s)
            if isinstance(decided, Fail):
                await store.finish_line(session, batch.id, line.line, FAILED, error_line(
                    batch.id, line.line, line.custom_id, decided.code, decided.message))
            else:
                await store.retry_line(session, batch.id, line.line, decided.not_before,
                                       decided.counts_as_attempt)


def _unrun_line(batch_id: str, line: int, custom_id: Optional[str], status: str) -> str:
    """The error line of a line that never ran: expired or cancelled with its batch."""
    if status == EXPIRED:
        return error_line(batch_id, line, custom_id, "batch_expired",
                          "the request could not be run before the batch expired")
    if status == CANCELLED:
        return error_line(batch_id, line, custom_id, "batch_cancelled",
                          "the batch was cancelled before the request ran")
    return error_line(batch_id, line, custom_id, "internal_error", f"the request ended {status}")


async def _never_disconnects() -> Message:
    """A batch line has no client to leave: the answer is read whole."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")
