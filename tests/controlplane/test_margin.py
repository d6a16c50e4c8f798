"""The margin report (GET /v1/billing/margin) over a small history written through the
product's own paths (usage rows through the UsageWriter, lifetimes through the replica
event sink, prices and costs through their stores), on a real Postgres; every figure
checked to the digit, by deployment and by tenant, in JSON and CSV; a tenant refused.

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
import csv
import dataclasses
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.billing.pricing import Pricing
from controlplane.store import deployments, gpu_costs, prices
from controlplane.store.desired_state import PostgresReplicaEvents
from controlplane.store.tables import Tenant
from pool.api import ReplicaEvent
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.usage import make_record

pytestmark = pytest.mark.asyncio(loop_scope="session")
T0 = datetime(2027, 2, 1, tzinfo=timezone.utc)
WINDOW = {"from": "2027-02-01T00:00:00Z", "to": "2027-02-01T01:00:00Z"}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-margin"),
                             gpu_cost_per_second=Decimal("0.0001"),
                             price_gpu_second=Decimal("0.0002"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(plane, model_uri):
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


A_CHAT = {
    "key": "margin-a/chat", "tenant": "margin-a", "deployment": "chat", "requests": 3,
    "prompt_tokens": 2500, "cached_tokens": 1000, "completion_tokens": 600, "tokens": 3100,
    "token_revenue": "1.500000000000000", "gpu_revenue": "10.800000000000000",
    "revenue": "12.300000000000000", "gpu_cost": "4.800000000000000",
    "margin": "7.500000000000000", "margin_pct": "60.98",
    "gpu_seconds": "3600.000000", "idle_gpu_seconds": "3060.000000", "idle_share": "0.850000",
    "asleep_gpu_seconds": "2400.000000", "sleep_share": "0.400000",
    "cost_per_1k_tokens": "1.548387096774194", "cache_hit_rate": "0.400000",
    "mean_batch_size": "1.222222", "quantization": ["int8"], "gpu_kinds": ["cuda"]}
A_EMBED = {
    "key": "margin-a/embed", "tenant": "margin-a", "deployment": "embed", "requests": 1,
    "prompt_tokens": 40, "cached_tokens": 0, "completion_tokens": 0, "tokens": 40,
    "token_revenue": "0.040000000000000", "gpu_revenue": "0.120000000000000",
    "revenue": "0.160000000000000", "gpu_cost": "0.060000000000000",
    "margin": "0.100000000000000", "margin_pct": "62.50",
    "gpu_seconds": "600.000000", "idle_gpu_seconds": "570.000000", "idle_share": "0.950000",
    "asleep_gpu_seconds": "0.000000", "sleep_share": "0.000000",
    "cost_per_1k_tokens": "1.500000000000000", "cache_hit_rate": "0.000000",
    "mean_batch_size": "1.000000", "quantization": ["none"], "gpu_kinds": ["unknown"]}
B_CHAT = {
    "key": "margin-b/chat", "tenant": "margin-b", "deployment": "chat", "requests": 1,
    "prompt_tokens": 200, "cached_tokens": 100, "completion_tokens": 50, "tokens": 250,
    "token_revenue": "0.250000000000000", "gpu_revenue": "0.600000000000000",
    "revenue": "0.850000000000000", "gpu_cost": "0.300000000000000",
    "margin": "0.550000000000000", "margin_pct": "64.71",
    "gpu_seconds": "3000.000000", "idle_gpu_seconds": "2970.000000", "idle_share": "0.990000",
    "asleep_gpu_seconds": "0.000000", "sleep_share": "0.000000",
    "cost_per_1k_tokens": "1.200000000000000", "cache_hit_rate": "0.500000",
    "mean_batch_size": "1.000000", "quantization": ["none"], "gpu_kinds": ["cpu"]}
TOTALS = {
    "requests": 5, "prompt_tokens": 2740, "cached_tokens": 1100, "completion_tokens": 650,
    "tokens": 3390, "token_revenue": "1.790000000000000", "gpu_revenue": "11.520000000000000",
    "revenue": "13.310000000000000", "gpu_cost": "5.160000000000000",
    "margin": "8.150000000000000", "margin_pct": "61.23",
    "gpu_seconds": "7200.000000", "idle_gpu_seconds": "6600.000000", "idle_share": "0.916667",
    "asleep_gpu_seconds": "2400.000000", "sleep_share": "0.250000",
    "cost_per_1k_tokens": "1.522123893805310", "cache_hit_rate": "0.401460",
    "mean_batch_size": "1.181818", "quantization": ["int8", "none"],
    "gpu_kinds": ["cpu", "cuda", "unknown"]}


async def margin(plane, **params):
    response = await plane.admin.get("/v1/billing/margin", params={**WINDOW, **params})
    assert response.status_code == 200, response.text
    return response


async def test_by_deployment_every_figure_is_exact(plane, world):
    body = (await margin(plane, group_by="deployment")).json()
    assert body["rows"] == [A_CHAT, A_EMBED, B_CHAT]
    assert body["totals"] == TOTALS
    assert (body["from"], body["to"], body["group_by"]) == (
        "2027-02-01T00:00:00+00:00", "2027-02-01T01:00:00+00:00", "deployment")


async def test_revenue_is_what_each_tenants_bill_says(plane, world):
    """The margin's revenue is the billing report's cost, row for row and in total."""
    body = (await margin(plane)).json()
    for tenant in ("margin-a", "margin-b"):
        bill = (await plane.client(world["keys"][tenant]).get("/v1/billing/report", params={
            **WINDOW, "group_by": "deployment"})).json()
        mine = {r["deployment"]: r for r in body["rows"] if r["tenant"] == tenant}
        assert {k: (r["token_revenue"], r["gpu_revenue"], r["revenue"]) for k, r in mine.items()} \
            == {r["key"]: (r["token_cost"], r["gpu_cost"], r["cost"]) for r in bill["rows"]}


async def test_by_tenant_the_rows_are_each_tenants_and_the_totals_the_same(plane, world):
    body = (await margin(plane, group_by="tenant")).json()
    a, b = body["rows"]
    assert (a["key"], a["tenant"], a["deployment"]) == ("margin-a", "margin-a", None)
    assert {k: a[k] for k in ("revenue", "gpu_cost", "margin", "margin_pct", "gpu_seconds",
                              "idle_gpu_seconds", "asleep_gpu_seconds", "sleep_share",
                              "cache_hit_rate", "mean_batch_size", "cost_per_1k_tokens",
                              "quantization", "gpu_kinds")} == {
        "revenue": "12.460000000000000", "gpu_cost": "4.860000000000000",
        "margin": "7.600000000000000", "margin_pct": "61.00", "gpu_seconds": "4200.000000",
        "idle_gpu_seconds": "3630.000000", "asleep_gpu_seconds": "2400.000000",
        "sleep_share": "0.363636", "cache_hit_rate": "0.393701", "mean_batch_size": "1.200000",
        "cost_per_1k_tokens": "1.547770700636943", "quantization": ["int8", "none"],
        "gpu_kinds": ["cuda", "unknown"]}
    assert b == {**B_CHAT, "key": "margin-b", "deployment": None}
    assert body["totals"] == TOTALS


async def test_csv_has_the_rows_and_a_total_line(plane, world):
    response = await margin(plane, format="csv")
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["key"] for r in rows] == ["margin-a/chat", "margin-a/embed", "margin-b/chat",
                                        "TOTAL"]
    assert rows[0] == {k: "+".join(v) if isinstance(v, list) else str(v)
                       for k, v in A_CHAT.items()}
    assert rows[-1] == {"key": "TOTAL", "tenant": "", "deployment": "",
                        **{k: "+".join(v) if isinstance(v, list) else str(v)
                           for k, v in TOTALS.items()}}


async def test_a_tenant_never_sees_the_platforms_costs(plane, world):
    for params in ({}, {"group_by": "tenant"}, {"format": "csv"}):
        refused = await plane.client(world["keys"]["margin-a"]).get(
            "/v1/billing/margin", params={**WINDOW, **params})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "admin_required"
        assert "4.8" not in refused.text


@pytest.mark.parametrize("params", [{"group_by": "day"}, {"format": "xml"},
                                    {"tenant": "margin-a"}, {"from": "soon"},
                                    {"from": "2027-02-02", "to": "2027-02-01"}])
async def test_bad_margin_queries_are_400(plane, world, params):
    response = await plane.admin.get("/v1/billing/margin", params={**WINDOW, **params})
    assert response.status_code == 400 and response.json()["error"]["param"], response.text


async def test_an_empty_window_has_no_rows_and_no_ratios(plane, world):
    body = (await margin(plane, **{"from": "2030-01-01", "to": "2030-01-02"})).json()
    assert body["rows"] == []
    assert body["totals"]["revenue"] == "0.000000000000000"
    assert [body["totals"][k] for k in ("margin_pct", "idle_share", "sleep_share",
                                        "cost_per_1k_tokens", "cache_hit_rate",
                                        "mean_batch_size")] == [None] * 6
