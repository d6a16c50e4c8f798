"""Fault 1: Postgres SIGKILLed and restarted under 100+ concurrent streams. Calls by
known keys go on being served from memory while it is down (never a 500), their usage
waits in the outbox, and the bill comes out exact once Postgres is back."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from tests.faults.bill import ReplicaWatch, reconcile
from tests.faults.scenario import Scenario
from tests.faults.traffic import steady
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(300)
STREAMS = 104           # in flight at once when Postgres is killed
OUTAGE_CALLS = 104      # calls that start (and end) while it is down: a round of every stream
AFTER_CALLS = 16


async def test_postgres_killed_under_load(stack, model_uri):
    scenario = Scenario.begin(stack, "pg-killed", model_uri, target_concurrency=STREAMS * 2)
    with ReplicaWatch(stack.plane) as watch:
        await scenario.warm()
        done = asyncio.Event()
        load = asyncio.create_task(steady(scenario.api, scenario.ledger, scenario.tenant,
                                          scenario.model, 6, STREAMS, done))
        await eventually(lambda: scenario.count() >= STREAMS + 1, timeout_s=120,
                         what="every stream started")
        await asyncio.to_thread(stack.kill_postgres)   # the clients go on reading meanwhile
        before = scenario.count()
        try:
            await eventually(lambda: scenario.count() >= before + OUTAGE_CALLS, timeout_s=120,
                             what="calls served while Postgres is down")
            during = scenario.ledger.calls[before:]
        finally:
            await asyncio.to_thread(stack.start_postgres)
        after = scenario.count()
        await eventually(lambda: scenario.count() >= after + AFTER_CALLS, timeout_s=120,
                         what="calls after Postgres is back")
        done.set()
        await load
        await scenario.finish(watch)

    failed = [c.error for c in scenario.ledger.calls if c.status != 200]
    assert scenario.ledger.by_status() == {200: scenario.count()}, f"every call served: {failed}"
    assert all(c.finished for c in during), "served from memory while Postgres was down"
    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    assert code == 0, out
