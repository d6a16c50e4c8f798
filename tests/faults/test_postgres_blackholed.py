"""Fault 5: Postgres blackholed (every process stopped with SIGSTOP: connections are
accepted and never answered), then continued. Calls go on being served from memory,
the control plane holds at most THAWPOOL_USAGE_BUFFER_MAX usage events in memory (the
rest spill to the outbox), and the outbox is replayed once Postgres answers again."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from tests.controlplane.support.postgres import frozen
from tests.faults.bill import ReplicaWatch, reconcile
from tests.faults.scenario import Scenario
from tests.faults.stack import PLANE_ENV
from tests.faults.traffic import steady
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(300)
STREAMS = 16
BUFFER_MAX = int(PLANE_ENV["THAWPOOL_USAGE_BUFFER_MAX"])
PENDING = "thawpool_usage_events_pending"


async def test_postgres_blackholed(stack, model_uri):
    scenario = Scenario.begin(stack, "pg-frozen", model_uri)
    plane = stack.plane
    with ReplicaWatch(plane) as watch:
        await scenario.warm()
        done = asyncio.Event()
        load = asyncio.create_task(steady(scenario.api, scenario.ledger, scenario.tenant,
                                          scenario.model, 6, STREAMS, done))
        spilled_before = await asyncio.to_thread(plane.metric, "thawpool_usage_events_spilled_total")
        pending: list[float] = []

        async def served_through(target: int) -> bool:
            pending.append(await asyncio.to_thread(plane.metric, PENDING))
            return scenario.count() >= target
        with frozen(stack.pg):
            before = scenario.count()
            await eventually(lambda: served_through(before + 4 * BUFFER_MAX), timeout_s=120,
                             every_s=0.1, what="calls served while Postgres is blackholed")
            during = scenario.ledger.calls[before:]
        spilled = await asyncio.to_thread(plane.metric, "thawpool_usage_events_spilled_total")
        done.set()
        await load
        await scenario.finish(watch)

    assert scenario.ledger.by_status() == {200: scenario.count()}, "every call served, no 500"
    assert all(c.finished for c in during)
    assert max(pending) <= BUFFER_MAX, f"usage events in memory: {max(pending)} > {BUFFER_MAX}"
    assert spilled > spilled_before, "the full buffer spilled to the outbox"
    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    assert code == 0, out
