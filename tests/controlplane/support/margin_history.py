"""A small history of two tenants for the margin report's tests (tests/controlplane/
test_margin.py pins every figure of it; tests/cli/test_margin.py shows it through the
CLI), written through the product's own paths: usage rows through the UsageWriter,
lifetimes through the replica event sink, prices and costs through their stores.

The window is [T0, T0 + 1 h). The cost book: the default 0.0001 a GPU-second (from the
settings), cuda 0.001 from a day before and 0.002 from T0 + 30 min. Prices: the default
0.0002 a GPU-second (settings), margin-a's `chat` 0.003.

- margin-a/chat (int8), replica a-1, 2 cuda GPUs: placed T0 - 10 min, asleep from
  T0 + 20 to T0 + 40 min, stopped T0 + 50 min. Held in the window 20 + 10 min (3600
  GPU-s), asleep 20 min (2400 GPU-s). Cost 1200 s x 2 x 0.001 + 600 s x 2 x 0.002 = 4.8;
  billed 1800 s x 2 x 0.003 = 10.8. Calls: c0 from T0 - 2 min to T0 + 30 s (billed before
  the window; 30 s of it ran inside), c1 T0+1..T0+3 min and c2 T0+2..T0+4 min (together:
  180 s busy, 240 s of calls), c3 from T0 + 39 min waiting 60 s for the wake to T0 + 41
  min (60 s). Busy 270 s, calls 330 s, idle (1800 - 270) x 2 = 3060 GPU-s.
- margin-a/embed, replica a-2, 1 GPU of unknown kind (default cost): T0 to T0 + 10 min,
  600 GPU-s, cost 0.06, billed 0.12; one 30 s call.
- margin-b/chat (another tenant's deployment of the same name), replica b-1, 1 cpu GPU
  (no cpu row: the default): T0 + 10 min to T0 + 70 min, 3000 GPU-s in the window, cost
  0.3, billed 0.6; one call from T0 + 15 min that waited 30 s in the queue, then ran 30 s.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from sqlalchemy import select

from controlplane.billing.pricing import Pricing
from controlplane.store import deployments, gpu_costs, prices
from controlplane.store.desired_state import PostgresReplicaEvents
from controlplane.store.tables import Tenant
from pool.api import ReplicaEvent
from tests.controlplane.support.usage import make_record

T0 = datetime(2027, 2, 1, tzinfo=timezone.utc)
WINDOW = {"from": "2027-02-01T00:00:00Z", "to": "2027-02-01T01:00:00Z"}
# what the control plane's settings must say for these numbers
SETTINGS = {"gpu_cost_per_second": Decimal("0.0001"), "price_gpu_second": Decimal("0.0002")}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def write_history(plane, model_uri: str) -> dict:
    """The tenants' keys and deployments, after writing their history."""
    keys = {t: await plane.tenant_key(t) for t in ("margin-a", "margin-b")}
    made = {}
    for tenant, name, engine in [("margin-a", "chat", {"quantization": "int8"}),
                                 ("margin-a", "embed", {}), ("margin-b", "chat", {})]:
        created = await plane.client(keys[tenant]).post("/v1/deployments", json={
            "name": name, "model_uri": model_uri, "engine": engine})
        assert created.status_code == 201, created.text
        made[f"{tenant}/{name}"] = created.json()
    async with plane.app.state.sessions.begin() as session:
        ids = {t.name: t.id for t in await session.scalars(select(Tenant))}
        for key, deployment in made.items():
            deployment["tenant_id"] = ids[key.partition("/")[0]]
        a = await session.get(Tenant, ids["margin-a"])
        await prices.add(session, Pricing(gpu_second=Decimal("0.003")), at(-24 * 60), a,
                         await deployments.find(session, a.id, "chat"))
        await gpu_costs.add(session, "cuda", Decimal("0.001"), at(-24 * 60))
        await gpu_costs.add(session, "cuda", Decimal("0.002"), at(30))
    await lifetimes(plane, made)
    await usage(plane, made)
    return {"keys": keys, "made": made}


async def lifetimes(plane, made) -> None:
    sink = PostgresReplicaEvents(plane.app.state.sessions)
    for replica, key, gpus, kind, steps in [
            ("a-1", "margin-a/chat", 2, "cuda", [("pending", -10, False), ("pulling", -10, True),
                                                 ("ready", -5, True), ("draining", 20, True),
                                                 ("sleeping", 20, False), ("waking", 40, True),
                                                 ("ready", 40, True), ("stopped", 50, True)]),
            ("a-2", "margin-a/embed", 1, None, [("pulling", 0, True), ("stopped", 10, True)]),
            ("b-1", "margin-b/chat", 1, "cpu", [("pulling", 10, True), ("ready", 11, True),
                                                ("stopped", 70, True)])]:
        deployment = made[key]
        for state, minute, placed in steps:
            await sink.replica_changed(ReplicaEvent(
                replica_id=replica, revision_id=deployment["revisions"][0]["id"],
                deployment_id=deployment["id"], tenant_id=deployment["tenant_id"], state=state,
                at=at(minute), gpu_count=gpus,
                slot_ids=tuple(f"{replica}/{i}" for i in range(gpus)) if placed else (),
                gpu_kind=kind if placed else None))


async def usage(plane, made) -> None:
    """(deployment, replica, start, queue s, finish, prompt, cached, completion, cost)"""
    for key, replica, start, queue_s, finish, prompt, cached, completion, cost in [
            ("margin-a/chat", "a-1", -2, 0, 0.5, 100, 0, 10, "9"),        # billed before
            ("margin-a/chat", "a-1", 1, 0, 3, 1000, 250, 200, "0.5"),
            ("margin-a/chat", "a-1", 2, 0, 4, 1000, 750, 300, "0.7"),
            ("margin-a/chat", "a-1", 39, 60, 41, 500, 0, 100, "0.3"),
            ("margin-a/embed", "a-2", 5, 0, 5.5, 40, 0, 0, "0.04"),
            ("margin-b/chat", "b-1", 15, 30, 16, 200, 100, 50, "0.25")]:
        deployment = made[key]
        record = make_record(
            tenant_id=deployment["tenant_id"], deployment_id=deployment["id"],
            deployment_name=deployment["name"], replica_id=replica, started_at=at(start),
            prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
            cost=Decimal(cost))
        plane.app.state.writer.submit(dataclasses.replace(
            record, queue_s=float(queue_s), finished_at=at(finish)))
    await plane.flush_usage()
