"""Fault 6: a torn outbox tail. The control plane dies (SIGKILL) while usage waits in its
outbox (Postgres is down) and in the middle of appending one more record: half of it is
on disk. Started again, it cuts the torn half and replays the rest: every call billed
exactly once, nothing lost, nothing from the torn half."""
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest

from controlplane.billing.outbox import frame, unframe
from tests.faults.bill import ReplicaWatch, reconcile
from tests.faults.scenario import Scenario

pytestmark = pytest.mark.timeout(300)
FINISHED = 6


async def test_torn_outbox_tail(stack, model_uri):
    scenario = Scenario.begin(stack, "torn-tail", model_uri)
    plane = stack.plane
    with ReplicaWatch(plane) as watch:
        await scenario.warm()
        stack.kill_postgres()
        try:
            await scenario.into_outbox(FINISHED)
            plane.kill()
            _append_half_a_record(plane.outbox_path)
        finally:
            await asyncio.to_thread(stack.start_postgres)
        await asyncio.to_thread(plane.start)
        again = await scenario.call()
        assert again.finished, again
        await scenario.finish(watch)

    assert plane.outbox_path.read_bytes().endswith(b"\n") or not plane.outbox_path.read_bytes(), \
        "no torn record left at the end of the outbox"
    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    assert code == 0, out


def _append_half_a_record(path) -> None:
    """Half of one more framed record (a call of its own), as a crash mid-append leaves it."""
    last = path.read_bytes().splitlines()[-1]
    record = json.loads(unframe(last))
    record.update(invocation_id="torn" + record["invocation_id"][4:], request_id="torn-tail-record")
    whole = frame(json.dumps(record).encode())
    with open(path, "ab") as out:
        out.write(whole[: len(whole) // 2])
