"""What every fault test does around its fault: a tenant and a deployment of its own,
traffic counted by the client, and at the end the deployment removed (so each replica
stops and is counted on its way out) and the bill held against what happened."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import openai

from tests.faults.bill import (ReplicaWatch, assert_billed_as_received, assert_gpu_time_true, lifetimes,
                               settled_rows)
from tests.faults.stack import FaultStack
from tests.faults.traffic import Call, Ledger, client, stream_chat
from tests.support.waiting import eventually


@dataclass
class Scenario:
    stack: FaultStack
    tenant: str
    key: str
    model: str
    api: openai.AsyncOpenAI
    deployment: dict[str, Any]
    started: datetime
    ledger: Ledger = field(default_factory=Ledger)

    @classmethod
    def begin(cls, stack: FaultStack, tenant: str, model_uri: str, **scaling: Any) -> "Scenario":
        started = datetime.now(timezone.utc)
        key = stack.tenant_key(tenant)
        deployment = stack.deploy(key, tenant, model_uri, **scaling)
        return cls(stack, tenant, key, tenant, client(stack.base_url, key), deployment, started)

    def count(self) -> int:
        return len(self.ledger.calls)

    async def call(self, max_tokens: int = 6, **kw: Any) -> Call:
        return await stream_chat(self.api, self.ledger, self.tenant, self.model, max_tokens, **kw)

    async def warm(self) -> Call:
        """One call that thaws the deployment (a cold start) and is answered in full."""
        call = await self.call()
        assert call.status == 200 and call.finished, call
        return call

    async def reading(self, streams: int, tokens: int, max_tokens: int = 400,
                      attempts: int = 3) -> list["asyncio.Task[Call]"]:
        """`streams` long streams, returned once each has read `tokens` tokens and none is
        past half its answer: all in flight. On a loaded machine one stream can run to its
        end before the last has started; then that batch is read to its end (billed as
        any other call) and a new one started."""
        for _ in range(attempts):
            tasks, ahead = await self._batch(streams, tokens, max_tokens)
            if not ahead:
                return tasks
            await asyncio.gather(*tasks)
        raise AssertionError(f"in {attempts} batches a stream always ran ahead of the others")

    async def _batch(self, streams: int, tokens: int,
                     max_tokens: int) -> tuple[list["asyncio.Task[Call]"], list[Call]]:
        read: dict[str, Call] = {}
        all_read = asyncio.Event()

        async def on_chunk(call: Call) -> None:
            if call.completion_tokens >= tokens:
                read[call.request_id] = call
                if len(read) >= streams:
                    all_read.set()
        tasks = [asyncio.create_task(self.call(max_tokens, on_chunk=on_chunk)) for _ in range(streams)]
        await asyncio.wait_for(all_read.wait(), 120)
        ahead = [c for c in read.values() if c.finished or c.completion_tokens > max_tokens // 2]
        return tasks, ahead

    async def into_outbox(self, calls: int) -> list[Call]:
        """`calls` calls answered in full while Postgres is down, once their usage is in
        the control plane's outbox."""
        plane = self.stack.plane
        assert plane is not None
        finished = await asyncio.gather(*(self.call() for _ in range(calls)))
        assert all(c.finished for c in finished), finished
        await eventually(lambda: plane.outbox_records() >= calls, timeout_s=60,
                         what="the finished calls' usage in the outbox")
        return list(finished)

    async def finish(self, watch: ReplicaWatch) -> None:
        """Remove the deployment, wait for its replicas to be gone and their lifetimes
        closed, then check tokens (exact per call) and GPU time
        (within a heartbeat)."""
        self.stack.undeploy(self.key, self.model)
        uri = self.stack.pg.libpq_uri
        await eventually(lambda: _all_closed(uri, self.tenant), timeout_s=90,
                         what=f"every lifetime of {self.tenant} closed")
        watch.poll()
        await eventually(lambda: not watch.running(), timeout_s=30, what="every replica process gone")
        rows = await settled_rows(uri, self.ledger, self.tenant)
        assert_billed_as_received(self.ledger, rows, self.tenant)
        assert_gpu_time_true(await lifetimes(uri, self.tenant), watch)


async def _all_closed(libpq_uri: str, tenant: str) -> bool:
    rows = await lifetimes(libpq_uri, tenant)
    return bool(rows) and all(r["stopped_at"] is not None for r in rows)
