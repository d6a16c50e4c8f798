"""Fault 2: the control plane SIGKILLed mid-stream, with usage waiting in its outbox
(Postgres is down) and a live replica; started again on the same data dir. The replica
is re-adopted (same process, same lifetime, billed all along: it held its slot), the
outbox is replayed once, and every call that finished before the kill is billed exactly.

Streams in flight at the kill end with the process (B-CP-3 in docs/billing-guarantees.md):
each is billed what its client received, or, while that is not yet guaranteed, its
replica's own counters show the tokens nobody billed and `thawpool admin reconcile`
reports them as drift; it never passes them by in silence."""
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
        served_by = await eventually(lambda: _served_by(stack, scenario, again.request_id), timeout_s=60,
                                     what="the usage row of the call after the restart")
        assert served_by.get(again.request_id) == before.replica_id and before.gone_at is None, \
            "the replica that outlived the control plane was re-adopted and serves again"
        unbilled = frozenset(c.request_id for c in cut if c.request_id not in served_by)
        await scenario.finish(watch, unbilled=unbilled)

    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    if unbilled:
        assert code == 1 and out.count("DRIFT") == 1, out
        found = re.search(rf"DRIFT replica {before.replica_id} .*: served (\d+)\+(\d+) billed (\d+)\+(\d+)", out)
        assert found, out
        served, billed = int(found[2]), int(found[4])
        received = sum(c.completion_tokens for c in cut if c.request_id in unbilled)
        assert served - billed >= received > 0, ("the drift covers what the cut streams received", out)
    else:
        assert code == 0, out


async def _served_by(stack, scenario, request_id):
    """request id -> replica id of the tenant's rows, once `request_id` has one."""
    rows = {r["request_id"]: r["replica_id"] for r in await usage_rows(stack.pg.libpq_uri, scenario.tenant)}
    return rows if request_id in rows else None
