"""Fault 4: a replica SIGKILLed under load. Its streams end with an error event and are
billed `partial` for exactly the tokens each client received; the next call thaws a
replacement (after one 502 with Retry-After if it reached the pool before the death
did); the killed replica's GPU time ends within a heartbeat of its death."""
from __future__ import annotations

import asyncio
import os
import signal
from datetime import datetime, timezone

import pytest

from tests.faults.bill import ReplicaWatch, reconcile, usage_rows
from tests.faults.scenario import Scenario

pytestmark = pytest.mark.timeout(300)
STREAMS = 8


async def test_replica_killed_under_load(stack, model_uri):
    scenario = Scenario.begin(stack, "replica-killed", model_uri)
    with ReplicaWatch(stack.plane) as watch:
        await scenario.warm()
        (victim,) = watch.running()
        streams = await scenario.reading(STREAMS, tokens=2)
        os.kill(victim.pid, signal.SIGKILL)
        cut = await asyncio.gather(*streams)
        assert [c.status for c in cut] == [502] * STREAMS and not any(c.finished for c in cut), cut
        after = await scenario.call()
        if after.status == 502 and after.retry_after is not None and "unreachable" in (after.error or ""):
            # routed to the victim before the pool saw it die: refused at connect (nothing
            # reached it), a 502 with Retry-After, which a client honors; billed nothing
            await asyncio.sleep(float(after.retry_after))
            after = await scenario.call()
        assert after.finished, after
        await scenario.finish(watch)

    rows = {r["request_id"]: r for r in await usage_rows(stack.pg.libpq_uri, scenario.tenant)}
    assert {rows[c.request_id]["status"] for c in cut} == {"partial"}
    assert rows[after.request_id]["replica_id"] not in (None, victim.replica_id), "a replacement served"
    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    assert code == 0, out
