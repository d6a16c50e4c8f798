"""A batch of 1,000 lines across a control-plane SIGKILL (issue 35): the kill lands with
lines answered, lines on the replica and lines not started; the next start runs what
was cut again under the same invocation ids, and the batch completes with every line
answered once (its output file: 1,000 lines, in input order, each custom_id once) and
billed once (one usage row per line, under the line's own invocation id)."""
from __future__ import annotations

import asyncio
import io
import json

import pytest

from controlplane.batch.results import invocation_id
from tests.faults.bill import ReplicaWatch, _fetch
from tests.faults.scenario import Scenario
from tests.faults.traffic import client
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(400)
LINES = 1000
KILL_AFTER = 150          # lines answered before the kill


def _input() -> bytes:
    return "".join(json.dumps({
        "custom_id": f"req-{n}", "method": "POST", "url": "/v1/completions",
        "body": {"model": "batch-kill", "prompt": f"Count {n}", "max_tokens": 2, "temperature": 0}})
        + "\n" for n in range(LINES)).encode()


async def _line_states(stack, batch_id: str) -> dict[str, int]:
    rows = await _fetch(stack.pg.libpq_uri, "SELECT status, count(*) AS n FROM batch_lines "
                        "WHERE batch_id = $1 GROUP BY status", batch_id)
    return {r["status"]: r["n"] for r in rows}


async def test_a_batch_completes_across_a_control_plane_sigkill(stack, model_uri):
    scenario = Scenario.begin(stack, "batch-kill", model_uri)
    with ReplicaWatch(stack.plane) as watch:
        await _run_across_a_kill(stack, scenario)
        stack.undeploy(scenario.key, scenario.model)       # the suite's next test starts clean
        await eventually(lambda: not watch.running(), timeout_s=60, what="every replica process gone")


async def _run_across_a_kill(stack, scenario: Scenario) -> None:
    await scenario.warm()
    source = await scenario.api.files.create(file=("in.jsonl", io.BytesIO(_input())), purpose="batch")
    batch = await scenario.api.batches.create(input_file_id=source.id, endpoint="/v1/completions",
                                              completion_window="24h")

    async def partly_done():
        states = await _line_states(stack, batch.id)
        return states if states.get("succeeded", 0) >= KILL_AFTER else None
    before = await eventually(partly_done, timeout_s=180, every_s=0.05,
                              what=f"{KILL_AFTER} lines answered before the kill")
    stack.plane.kill()
    at_kill = await _line_states(stack, batch.id)
    assert at_kill.get("pending", 0) > 0, f"the kill left lines to run: {at_kill} (before {before})"

    await asyncio.to_thread(stack.plane.start)
    if at_kill.get("running"):      # lines cut on their way: put back to run again
        assert f"{at_kill['running']} batch lines were cut by a restart" in stack.plane.tail(200_000)
    api = client(stack.base_url, scenario.key)

    async def completed():
        got = await api.batches.retrieve(batch.id)
        return got if got.status == "completed" else None
    done = await eventually(completed, timeout_s=240, every_s=0.5, what="the batch completed")
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0
    assert done.error_file_id is None
    output = [json.loads(x) for x in (await api.files.content(done.output_file_id)).text.splitlines()]
    assert [x["custom_id"] for x in output] == [f"req-{n}" for n in range(LINES)], \
        "every line answered once, in input order"
    assert all(x["response"]["status_code"] == 200 for x in output)

    async def billed():
        rows = await _fetch(stack.pg.libpq_uri, "SELECT invocation_id::text AS id, request_id, "
                            "status, prompt_tokens, completion_tokens, recovered "
                            "FROM usage_events WHERE request_id LIKE $1", f"{batch.id}-%")
        return rows if len(rows) >= LINES else None
    rows = await eventually(billed, timeout_s=60, every_s=0.25, what="a usage row per line")
    assert sorted(r["id"] for r in rows) == sorted(invocation_id(batch.id, n) for n in range(LINES)), \
        "one usage row per line, under its own invocation id: none twice, none missing"
    by_id = {r["id"]: r for r in rows}

    def billed_as(n: int) -> tuple[str, int, int]:
        row = by_id[invocation_id(batch.id, n)]
        return row["status"], row["prompt_tokens"], row["completion_tokens"]
    kept = [("ok", x["response"]["body"]["usage"]["prompt_tokens"],
             x["response"]["body"]["usage"]["completion_tokens"]) for x in output]
    wrong = [(n, billed_as(n), used) for n, used in enumerate(kept) if billed_as(n) != used]
    assert not wrong, f"each line billed what its kept answer used (a cut attempt bills nothing): {wrong[:3]}"
