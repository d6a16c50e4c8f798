"""The sleep tier through the real control plane and pool: a deployment with
`scaling.sleep_timeout_s` goes ready -> sleeping -> (a request) -> ready on the same
replica, the request succeeds, and the usage report's GPU seconds leave out the time
it slept (PostgresReplicaEvents records the sleeps, controlplane.billing.lifetimes bills around
them)."""
from datetime import timedelta

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import ReplicaLifetime, UsageEvent
from tests.controlplane.conftest import pooled_control_plane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
# idle 1 s, then asleep; the sleep timeout is long enough that the wake below never
# races the sleeper's stop on a slow machine (the pool's tests step through that stop)
SCALING = {"idle_timeout_s": 1, "sleep_timeout_s": 600}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-sleep"),
                                    heartbeat_s=0.5) as plane:
        yield plane


async def test_a_sleeping_deployment_wakes_on_a_request_and_bills_no_gpu_time_asleep(plane, model_uri):
    key = await plane.tenant_key("sleepy")
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={
        "name": "sleepy", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 512}, "scaling": SCALING})
    assert created.status_code == 201, created.text
    assert created.json()["scaling"]["sleep_timeout_s"] == 600

    async def complete(request_id):
        answer = await client.post("/v1/completions", headers={"x-request-id": request_id}, json={
            "model": "sleepy", "prompt": "Hello there", "max_tokens": 6, "temperature": 0})
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["text"]

    async def replica_states():
        status = (await client.get("/v1/deployments/sleepy")).json()["status"]["r1"]
        return status["state"], [r["state"] for r in status["replicas"]]

    first = await complete("sleepy-1")
    await eventually(lambda: _asleep(replica_states), timeout_s=60, what="the idle replica asleep")
    assert await complete("sleepy-2") == first, "woken with the same weights"
    assert (await replica_states())[0] in ("ready", "draining", "sleeping")

    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = (await session.scalars(select(UsageEvent).where(
            UsageEvent.request_id.in_(["sleepy-1", "sleepy-2"])))).all()
    assert len(rows) == 2 and rows[0].replica_id == rows[1].replica_id, "a wake, not a cold start"
    assert all(r.status == "ok" for r in rows)

    assert (await client.delete("/v1/deployments/sleepy")).status_code in (200, 204)
    lifetime = await eventually(lambda: _stopped(plane, rows[0].replica_id), timeout_s=60,
                                what="the replica's lifetime closed")
    marks = lifetime.sleeps
    assert len(marks) >= 2, f"it slept and woke: {marks}"
    awake = _awake_seconds(lifetime.placed_at, lifetime.stopped_at, marks)
    report = (await client.get("/v1/billing/report", params={
        "from": (lifetime.placed_at - timedelta(minutes=1)).isoformat(),
        "to": (lifetime.stopped_at + timedelta(minutes=1)).isoformat(),
        "group_by": "deployment"})).json()
    billed = float(report["totals"]["gpu_seconds"])
    assert billed == pytest.approx(awake, abs=1e-3)
    held = (lifetime.stopped_at - lifetime.placed_at).total_seconds()
    assert billed <= held - (marks[1] - marks[0]).total_seconds() + 1e-3, "the first sleep is not billed"


async def _asleep(replica_states) -> bool:
    state, replicas = await replica_states()
    return state == "sleeping" and replicas.count("sleeping") == 1


async def _stopped(plane, replica_id: str):
    async with plane.app.state.sessions() as session:
        lifetime = await session.scalar(select(ReplicaLifetime).where(
            ReplicaLifetime.replica_id == replica_id))
    return lifetime if lifetime is not None and lifetime.stopped_at is not None else None


def _awake_seconds(placed, stopped, marks) -> float:
    """placed..first sleep, each wake..next sleep, the last wake..stop (one GPU)."""
    edges = [placed, *marks] + ([stopped] if len(marks) % 2 == 0 else [])
    return sum((min(b, stopped) - a).total_seconds() for a, b in zip(edges[0::2], edges[1::2]))
