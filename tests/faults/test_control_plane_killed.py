"""Fault 2: the control plane SIGKILLed mid-stream, with usage waiting in its outbox
(Postgres is down) and a live replica; started again on the same data dir. The replica
is re-adopted (same process, same lifetime, billed all along: it held its slot), the
outbox is replayed once, and every call that finished before the kill is billed exactly.

Streams in flight at the kill end with the process (B-CP-3 in docs/billing-guarantees.md):
the next start bills each from the call journal for exactly what its client received
(a `recovered` row), and `thawpool admin reconcile` finds no drift: the adopted
replica's counters may only exceed the bill by what it generated after the last
delivery, which it prints as CUT."""
from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone

import pytest

from tests.faults.bill import ReplicaWatch, reconcile, usage_rows
from tests.faults.scenario import Scenario
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(300)
FINISHED = 8          # calls that end while Postgres is down: their usage is in the outbox
CUT = 3               # streams in flight when the control plane dies


async def test_control_plane_killed_mid_stream(stack, model_uri):
    scenario = Scenario.begin(stack, "cp-killed", model_uri)
    plane = stack.plane
    with ReplicaWatch(plane) as watch:
        await scenario.warm()
        (before,) = watch.running()
        stack.kill_postgres()
        try:
            await scenario.into_outbox(FINISHED)
            streams = await scenario.reading(CUT, tokens=3)
            plane.kill()
            cut = await asyncio.gather(*streams)
            assert not any(c.finished for c in cut), "the streams were cut by the kill"
        finally:
            await asyncio.to_thread(stack.start_postgres)
        await asyncio.to_thread(plane.start)
        again = await scenario.call()
        assert again.finished, again
        rows = await eventually(lambda: _rows_of(stack, scenario, [again, *cut]), timeout_s=60,
                                what="the rows of the cut streams and of the call after the restart")
        assert rows[again.request_id]["replica_id"] == before.replica_id and before.gone_at is None, \
            "the replica that outlived the control plane was re-adopted and serves again"
        assert all(rows[c.request_id]["recovered"] for c in cut), "billed from the call journal"
        assert sum(c.completion_tokens for c in cut) > 0, "the cut streams had received tokens"
        await scenario.finish(watch)       # each cut stream billed exactly what it received

    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    assert code == 0 and "DRIFT" not in out, out
    found = re.search(rf"CUT replica {before.replica_id}: served (\d+)\+(\d+) billed (\d+)\+(\d+)", out)
    if found:   # the adopted replica generated a few tokens after the dead gateway's last delivery
        assert int(found[2]) > int(found[4]) and f"{len(cut)} calls cut" in out, out


async def _rows_of(stack, scenario, calls):
    """request id -> usage row of the tenant's, once each of `calls` has one."""
    rows = {r["request_id"]: r for r in await usage_rows(stack.pg.libpq_uri, scenario.tenant)}
    return rows if all(c.request_id in rows for c in calls) else None
