"""Billing reports over [from, to) in UTC: rows, totals that add up, CSV, tenant scope."""
import csv
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.desired_state import PostgresReplicaEvents
from controlplane.metering import insert_usage
from controlplane.models import ApiKey, Tenant
from pool.api import ReplicaEvent
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.usage import make_record

pytestmark = pytest.mark.asyncio(loop_scope="session")
UTC = timezone.utc
DAY1 = datetime(2026, 3, 1, tzinfo=UTC)
WINDOW = {"from": "2026-03-01T00:00:00Z", "to": "2026-03-03T00:00:00Z"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-bill"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def billed(plane):
    """Tenant A with usage on two days, two deployments and two keys; tenant B with one row."""
    key_a = await plane.tenant_key("bill-a")
    key_b = await plane.tenant_key("bill-b")
    async with plane.app.state.sessions() as session:
        tenants = {t.name: t.id for t in await session.scalars(select(Tenant))}
        keys = {k.tenant_id: k for k in await session.scalars(select(ApiKey))}
    a, b = tenants["bill-a"], tenants["bill-b"]
    key_id = keys[a].id
    records = [
        make_record(tenant_id=a, started_at=DAY1, cost=Decimal("0.000000000000001"),
                    api_key_id=key_id),                                       # at `from`: in
        make_record(tenant_id=a, started_at=DAY1 + timedelta(hours=23, minutes=59),
                    cost=Decimal("1.25"), deployment_name="embed", api_key_id=key_id),
        # 01:30 at +02:00 is 23:30 UTC on day 1
        make_record(tenant_id=a, started_at=datetime(2026, 3, 2, 1, 30,
                                                     tzinfo=timezone(timedelta(hours=2))),
                    cost=Decimal("0.333333333333333"), revision_name="r2"),
        make_record(tenant_id=a, started_at=DAY1 + timedelta(days=1, hours=5),
                    cost=Decimal("2"), prompt_tokens=100, cached_tokens=40, status="partial"),
        make_record(tenant_id=a, started_at=DAY1 + timedelta(days=2), cost=Decimal(99)),  # at `to`: out
        make_record(tenant_id=a, started_at=DAY1 - timedelta(microseconds=1), cost=Decimal(99)),
        make_record(tenant_id=b, started_at=DAY1 + timedelta(hours=1), cost=Decimal(7)),
    ]
    await insert_usage(plane.app.state.db_engine, records)
    return {"a": a, "b": b, "key_a": key_a, "key_b": key_b, "prefix_a": keys[a].prefix}


def totals_of(rows):
    return {"requests": sum(r["requests"] for r in rows),
            "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "cost": sum(Decimal(r["cost"]) for r in rows)}


@pytest.mark.parametrize("group_by", ["day", "deployment", "model", "api_key", "revision"])
async def test_totals_are_the_sum_of_the_rows(plane, billed, group_by):
    report = (await plane.client(billed["key_a"]).get(
        "/v1/billing/report", params={**WINDOW, "group_by": group_by})).json()
    totals = report["totals"]
    assert totals["requests"] == 4
    assert Decimal(totals["cost"]) == Decimal("3.583333333333334")
    assert totals_of(report["rows"]) == {"requests": 4, "prompt_tokens": totals["prompt_tokens"],
                                         "cost": Decimal(totals["cost"])}
    assert totals["partial"] == 1 and totals["cached_tokens"] == 40


async def test_rows_are_grouped_in_utc(plane, billed):
    client = plane.client(billed["key_a"])
    days = (await client.get("/v1/billing/report", params={**WINDOW, "group_by": "day"})).json()
    assert [(r["key"], r["requests"]) for r in days["rows"]] == [("2026-03-01", 3),
                                                                 ("2026-03-02", 1)]
    deployments = (await client.get("/v1/billing/report",
                                    params={**WINDOW, "group_by": "deployment"})).json()
    assert {r["key"]: r["cost"] for r in deployments["rows"]} == {
        "chat": "2.333333333333334", "embed": "1.250000000000000"}
    keys = (await client.get("/v1/billing/report", params={**WINDOW, "group_by": "api_key"})).json()
    assert {r["key"] for r in keys["rows"]} == {billed["prefix_a"], "(none)"}
    revisions = (await client.get("/v1/billing/report",
                                  params={**WINDOW, "group_by": "revision"})).json()
    assert {r["key"] for r in revisions["rows"]} == {"chat/r1", "chat/r2", "embed/r1"}


async def test_csv_has_rows_and_a_total_line(plane, billed):
    response = await plane.client(billed["key_a"]).get(
        "/v1/billing/report", params={**WINDOW, "group_by": "deployment", "format": "csv"})
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["key"] for r in rows] == ["chat", "embed", "TOTAL"]
    assert sum(Decimal(r["cost"]) for r in rows[:-1]) == Decimal(rows[-1]["cost"])


async def test_a_tenant_sees_only_its_own_usage(plane, billed):
    mine = (await plane.client(billed["key_b"]).get("/v1/billing/report", params=WINDOW)).json()
    assert mine["totals"]["requests"] == 1 and Decimal(mine["totals"]["cost"]) == 7
    refused = await plane.client(billed["key_b"]).get(
        "/v1/billing/report", params={**WINDOW, "tenant": "bill-a"})
    assert refused.status_code == 403
    as_admin = (await plane.admin.get("/v1/billing/report",
                                      params={**WINDOW, "tenant": "bill-a"})).json()
    assert as_admin["tenant_id"] == billed["a"] and as_admin["totals"]["requests"] == 4


@pytest.mark.parametrize("params", [{"group_by": "week"}, {"format": "xml"},
                                    {"from": "yesterday"}, {"colour": "red"},
                                    {"from": "2026-03-02", "to": "2026-03-01"}])
async def test_bad_report_queries_are_400(plane, billed, params):
    response = await plane.client(billed["key_a"]).get("/v1/billing/report", params=params)
    assert response.status_code == 400 and response.json()["error"]["param"]


async def test_gpu_seconds_come_from_replica_lifetimes(plane, billed, model_uri):
    client = plane.client(billed["key_a"])
    created = await client.post("/v1/deployments", json={
        "name": "gpu", "model_uri": model_uri, "pricing": {"gpu_second": "0.01"}})
    revision = created.json()["revisions"][0]
    sink = PostgresReplicaEvents(plane.app.state.sessions)
    ids = dict(revision_id=revision["id"], deployment_id=created.json()["id"],
               tenant_id=billed["a"], gpu_count=2)
    # alive from 23:00 on Feb 28 to 00:10 on Mar 1: 10 minutes inside the window, 2 GPUs
    start = DAY1 - timedelta(hours=1)
    await sink.replica_changed(ReplicaEvent(replica_id="g-1", state="pending", at=start, **ids))
    await sink.replica_changed(ReplicaEvent(replica_id="g-1", state="stopped",
                                            at=DAY1 + timedelta(minutes=10), **ids))
    report = (await client.get("/v1/billing/report", params=WINDOW)).json()
    assert report["gpu"]["seconds"] == pytest.approx(1200.0)
    assert Decimal(report["gpu"]["cost"]) == Decimal("12")
