"""Interactive before batch on one deployment, end to end: the real control plane, the real
pool and a real replica whose engine runs one sequence at a time (max_num_seqs 1), so
every call but one waits in its scheduler. A flood of batch calls (a key whose default is
BATCH_PRIORITY) is queued, then interactive calls arrive: each interactive call's first
token comes before that of every batch call still waiting when it arrived.

Order is read from events, never from wall times: the order in which each streamed
call's first generated token reaches the client (its cumulative usage turns nonzero)."""
from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio

from tests.controlplane.conftest import pooled_control_plane
from tests.support.waiting import eventually
from wire.priority import BATCH_PRIORITY

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(600)]
BATCH_CALLS, INTERACTIVE_CALLS = 10, 3
# long enough that the flood is still queued when the interactive calls reach the replica
BATCH_TOKENS = 200
# one batch call may already hold the engine's only sequence when the interactive calls
# arrive, with its first token not yet at the client: the most that may be seen first
SLACK = 1


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-prio-e2e")) as plane:
        yield plane


async def _stream(client, deployment: str, name: str, first_tokens: list[str], max_tokens: int) -> int:
    """One streamed completion; its name is appended to `first_tokens` when its first
    generated token arrives. The status code."""
    body = {"model": deployment, "prompt": f"call {name} says", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            usage = json.loads(line[len("data: "):]).get("usage") or {}
            if usage.get("completion_tokens", 0) >= 1 and name not in first_tokens:
                first_tokens.append(name)
        return response.status_code


async def _flood(plane, model_uri: str, policy: str) -> tuple[list[str], set[str]]:
    """The order of first tokens, and the batch calls still waiting when the interactive
    ones were sent, on a fresh deployment whose engine runs `policy`."""
    tenant, deployment = f"prio-{policy}", f"gen-{policy}"
    owner = await plane.tenant_key(tenant)
    created = await plane.client(owner).post("/v1/deployments", json={
        "name": deployment, "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "scaling": {"max_replicas": 1},
        "engine": {"kv_cache_tokens": 512, "max_num_seqs": 1, "scheduling_policy": policy}})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]
    batch_key = await plane.tenant_key(tenant, scopes=("invoke",), priority_min=BATCH_PRIORITY)
    batch, interactive = plane.client(batch_key), plane.client(owner)
    warm = await batch.post("/v1/completions", json={"model": deployment, "prompt": "warm", "max_tokens": 1})
    assert warm.status_code == 200, warm.text          # the cold start is behind us

    first_tokens: list[str] = []
    flood = [asyncio.create_task(_stream(batch, deployment, f"b{i}", first_tokens, BATCH_TOKENS))
             for i in range(BATCH_CALLS)]
    pool = plane.app.state.pool

    def every_batch_call_reached_the_replica() -> bool:     # leased (in flight) or done
        held = sum(r.in_flight for r in pool.revision_status(revision_id).replicas)
        return held + sum(task.done() for task in flood) >= BATCH_CALLS
    await eventually(every_batch_call_reached_the_replica, timeout_s=60, what="the flood at the replica")
    await eventually(lambda: first_tokens, timeout_s=60, what="the first batch token")
    waiting = {f"b{i}" for i in range(BATCH_CALLS)} - set(first_tokens)
    assert len(waiting) >= BATCH_CALLS // 2, first_tokens     # the flood is queued, not done
    urgent = [asyncio.create_task(_stream(interactive, deployment, f"i{i}", first_tokens, 4))
              for i in range(INTERACTIVE_CALLS)]
    assert await asyncio.gather(*urgent, *flood) == [200] * (INTERACTIVE_CALLS + BATCH_CALLS)
    assert sorted(first_tokens) == sorted([f"b{i}" for i in range(BATCH_CALLS)] +
                                          [f"i{i}" for i in range(INTERACTIVE_CALLS)])
    return first_tokens, waiting


def _overtaken(first_tokens: list[str], waiting: set[str], name: str) -> list[str]:
    """The batch calls waiting when `name` was sent that got their first token before it."""
    return [b for b in first_tokens[:first_tokens.index(name)] if b in waiting]


async def test_interactive_calls_are_served_ahead_of_a_queued_batch_flood(plane, model_uri):
    first_tokens, waiting = await _flood(plane, model_uri, "priority")
    for i in range(INTERACTIVE_CALLS):
        overtaken = _overtaken(first_tokens, waiting, f"i{i}")
        assert len(overtaken) <= SLACK, (f"i{i} came after {overtaken} of the batch calls "
                                         f"waiting when it arrived; order: {first_tokens}")


async def test_under_fcfs_the_same_flood_keeps_them_waiting(plane, model_uri):
    """The measure above can fail: the engine serving by arrival makes it."""
    first_tokens, waiting = await _flood(plane, model_uri, "fcfs")
    assert len(_overtaken(first_tokens, waiting, "i0")) > SLACK, first_tokens
