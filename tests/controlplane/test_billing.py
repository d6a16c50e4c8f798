"""Billing reports over [from, to) in UTC: rows, totals (token cost, GPU cost, their sum)
that add up in JSON and CSV, GPU time grouped like usage, function calls' items and GPU
seconds reported but not billed, tenant scope, and `thawpool usage` over the report."""
import asyncio
import csv
import io
import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.desired_state import PostgresReplicaEvents
from controlplane.billing.metering import insert_usage
from controlplane.store.tables import ApiKey, Tenant
from controlplane.billing.pricing import Pricing
from controlplane.store import deployments, prices
from pool.api import ReplicaEvent
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.usage import make_record

pytestmark = pytest.mark.asyncio(loop_scope="session")
UTC = timezone.utc
DAY1 = datetime(2026, 3, 1, tzinfo=UTC)
WINDOW = {"from": "2026-03-01T00:00:00Z", "to": "2026-03-03T00:00:00Z"}
FUNCTION = dict(deployment_name="fn", model="s3://m/fn/", prompt_tokens=0, completion_tokens=0)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-bill"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def billed(plane):
    """Tenant A with usage on two days, two deployments and two keys, and two calls of its
    function "fn" (one per day; 0.0004123456 GPU seconds is reported as 0.000412); tenant
    B with one row."""
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
        make_record(tenant_id=a, started_at=DAY1 + timedelta(hours=2), cost=Decimal("0.0002"),
                    api_key_id=key_id, items=3, gpu_seconds=0.0004123456, **FUNCTION),
        make_record(tenant_id=a, started_at=DAY1 + timedelta(days=1, hours=2),
                    cost=Decimal("0.0002"), items=2, gpu_seconds=0.25, **FUNCTION),
        make_record(tenant_id=a, started_at=DAY1 + timedelta(days=2), cost=Decimal(99),
                    items=100, gpu_seconds=99.0, **FUNCTION),                  # at `to`: out
        make_record(tenant_id=b, started_at=DAY1 + timedelta(hours=1), cost=Decimal(7)),
    ]
    await insert_usage(plane.app.state.db_engine, records)
    return {"a": a, "b": b, "key_a": key_a, "key_b": key_b, "prefix_a": keys[a].prefix}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gpu_time(plane, billed, model_uri):
    """Tenant A's deployment "gpu" held 2 GPUs from 23:00 on Feb 28 to 00:10 on Mar 1 (10
    minutes inside the window) and 1 GPU for 30 minutes on Mar 2 after waiting 20 minutes
    for capacity (not billed). Its price override was 0.01 a GPU-second and became 0.02
    five minutes into the window (written to the book directly: the API takes no price
    in the past)."""
    client = plane.client(billed["key_a"])
    created = await client.post("/v1/deployments", json={"name": "gpu", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    async with plane.app.state.sessions.begin() as session:
        tenant = await session.get(Tenant, billed["a"])
        deployment = await deployments.find(session, billed["a"], "gpu")
        for price, since in [("0.01", DAY1 - timedelta(days=1)),
                             ("0.02", DAY1 + timedelta(minutes=5))]:
            await prices.add(session, Pricing(gpu_second=Decimal(price)), since, tenant,
                             deployment)
    sink = PostgresReplicaEvents(plane.app.state.sessions)
    ids = dict(revision_id=created.json()["revisions"][0]["id"],
               deployment_id=created.json()["id"], tenant_id=billed["a"])
    day2 = DAY1 + timedelta(days=1, hours=3)
    for replica_id, gpus, state, at, slots in [
            ("g-1", 2, "pending", DAY1 - timedelta(hours=1), ()),
            ("g-1", 2, "pulling", DAY1 - timedelta(hours=1), ("gpu0", "gpu1")),
            ("g-1", 2, "stopped", DAY1 + timedelta(minutes=10), ("gpu0", "gpu1")),
            ("g-2", 1, "pending", day2, ()),
            ("g-2", 1, "pulling", day2 + timedelta(minutes=20), ("gpu0",)),
            ("g-2", 1, "ready", day2 + timedelta(minutes=21), ("gpu0",)),
            ("g-2", 1, "stopped", day2 + timedelta(minutes=50), ("gpu0",))]:
        await sink.replica_changed(ReplicaEvent(replica_id=replica_id, state=state, at=at,
                                                gpu_count=gpus, slot_ids=slots, **ids))
    return {"seconds": 2 * 600 + 1800,
            "cost": 600 * Decimal("0.01") + 600 * Decimal("0.02") + 1800 * Decimal("0.02")}


TOKEN_COST_A = Decimal("3.583733333333334")
NUMBERS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "items", "partial",
           "errors")
MONEY = ("function_gpu_seconds", "token_cost", "gpu_seconds", "gpu_cost", "cost")


def assert_rows_add_up(rows, totals):
    """Every column of the totals is the sum of the rows, exactly; each cost is the sum of
    its token and GPU costs."""
    for name in NUMBERS:
        assert sum(int(r[name]) for r in rows) == int(totals[name]), name
    for name in MONEY:
        assert sum(Decimal(r[name]) for r in rows) == Decimal(totals[name]), name
    for row in [*rows, totals]:
        assert Decimal(row["cost"]) == Decimal(row["token_cost"]) + Decimal(row["gpu_cost"])


@pytest.mark.parametrize("group_by", ["day", "deployment", "model", "api_key", "revision"])
async def test_totals_are_the_sum_of_the_rows_in_json_and_csv(plane, billed, gpu_time, group_by):
    client = plane.client(billed["key_a"])
    params = {**WINDOW, "group_by": group_by}
    report = (await client.get("/v1/billing/report", params=params)).json()
    totals = report["totals"]
    assert totals["requests"] == 6 and totals["partial"] == 1 and totals["cached_tokens"] == 40
    assert totals["items"] == 5 and totals["function_gpu_seconds"] == "0.250412"
    assert Decimal(totals["token_cost"]) == TOKEN_COST_A
    assert Decimal(totals["gpu_seconds"]) == gpu_time["seconds"]
    assert Decimal(totals["gpu_cost"]) == gpu_time["cost"]
    assert Decimal(totals["cost"]) == TOKEN_COST_A + gpu_time["cost"], "an invoice from totals"
    assert report["gpu"] == {"seconds": gpu_time["seconds"], "cost": totals["gpu_cost"]}
    assert_rows_add_up(report["rows"], totals)
    response = await client.get("/v1/billing/report", params={**params, "format": "csv"})
    lines = list(csv.DictReader(io.StringIO(response.text)))
    assert lines[-1]["key"] == "TOTAL"
    assert {k: str(v) for k, v in totals.items()} == {k: v for k, v in lines[-1].items()
                                                      if k != "key"}, "the same totals"
    assert_rows_add_up(lines[:-1], lines[-1])
    assert [r["key"] for r in lines[:-1]] == [r["key"] for r in report["rows"]]


async def test_gpu_time_is_grouped_like_usage(plane, billed, gpu_time):
    """By day a lifetime is cut at midnight UTC; by API key GPU time is a row of its own."""
    client = plane.client(billed["key_a"])

    async def rows(group_by):
        report = (await client.get("/v1/billing/report",
                                   params={**WINDOW, "group_by": group_by})).json()
        return {r["key"]: (Decimal(r["gpu_seconds"]), Decimal(r["gpu_cost"]))
                for r in report["rows"] if Decimal(r["gpu_seconds"])}

    assert await rows("day") == {"2026-03-01": (1200, Decimal(18)),
                                 "2026-03-02": (1800, Decimal(36))}
    assert await rows("deployment") == {"gpu": (3000, Decimal(54))}
    assert list(await rows("revision")) == ["gpu/r1"]
    assert await rows("api_key") == {"(gpu time)": (3000, Decimal(54))}


async def test_function_calls_report_items_and_gpu_seconds_that_are_not_billed(plane, billed,
                                                                              gpu_time):
    """A call's `gpu_seconds` is its share of compute on a replica whose held time is
    already `gpu_seconds` at `gpu_cost`: reported apart, never priced again."""
    client = plane.client(billed["key_a"])

    async def rows(group_by):
        report = (await client.get("/v1/billing/report",
                                   params={**WINDOW, "group_by": group_by})).json()
        return {r["key"]: (r["items"], r["function_gpu_seconds"], r["gpu_cost"], r["cost"])
                for r in report["rows"] if r["items"]}

    assert await rows("deployment") == {
        "fn": (5, "0.250412", "0.000000000000000", "0.000400000000000")}
    for group_by, expected in [("day", {"2026-03-01": (3, "0.000412"), "2026-03-02": (2, "0.250000")}),
                               ("api_key", {billed["prefix_a"]: (3, "0.000412"), "(none)": (2, "0.250000")}),
                               ("revision", {"fn/r1": (5, "0.250412")})]:
        assert {k: v[:2] for k, v in (await rows(group_by)).items()} == expected, group_by


async def test_thawpool_usage_shows_items_and_function_gpu_seconds(plane, billed, gpu_time,
                                                                   capsys, monkeypatch):
    from controlplane.cli.main import main

    monkeypatch.setenv("COLUMNS", "400")                  # the whole table on one line a row
    argv = ["usage", "--url", plane.base_url, "--key", billed["key_a"], "--group-by",
            "deployment", "--from", WINDOW["from"], "--to", WINDOW["to"]]
    assert await asyncio.to_thread(main, argv) == 0
    table = [[cell.strip() for cell in re.split("[│┃]", line)[1:-1]]
             for line in capsys.readouterr().out.splitlines()]
    header = next(cells for cells in table if "fn GPU s" in cells)
    total = dict(zip(header, next(cells for cells in table if cells and cells[0] == "TOTAL")))
    assert (total["items"], total["fn GPU s"]) == ("5", "0.250412"), table
    assert await asyncio.to_thread(main, [*argv, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert (rows[-1]["key"], rows[-1]["items"], rows[-1]["function_gpu_seconds"]) == (
        "TOTAL", "5", "0.250412")


async def test_rows_are_grouped_in_utc(plane, billed, gpu_time):
    client = plane.client(billed["key_a"])
    days = (await client.get("/v1/billing/report", params={**WINDOW, "group_by": "day"})).json()
    assert [(r["key"], r["requests"]) for r in days["rows"]] == [("2026-03-01", 4),
                                                                 ("2026-03-02", 2)]
    deployments = (await client.get("/v1/billing/report",
                                    params={**WINDOW, "group_by": "deployment"})).json()
    assert {r["key"]: r["token_cost"] for r in deployments["rows"]} == {
        "chat": "2.333333333333334", "embed": "1.250000000000000", "fn": "0.000400000000000",
        "gpu": "0.000000000000000"}
    keys = (await client.get("/v1/billing/report", params={**WINDOW, "group_by": "api_key"})).json()
    assert {r["key"] for r in keys["rows"]} == {billed["prefix_a"], "(none)", "(gpu time)"}
    revisions = (await client.get("/v1/billing/report",
                                  params={**WINDOW, "group_by": "revision"})).json()
    assert {r["key"] for r in revisions["rows"]} == {"chat/r1", "chat/r2", "embed/r1", "fn/r1",
                                                     "gpu/r1"}


async def test_a_tenant_sees_only_its_own_usage(plane, billed):
    mine = (await plane.client(billed["key_b"]).get("/v1/billing/report", params=WINDOW)).json()
    assert mine["totals"]["requests"] == 1 and Decimal(mine["totals"]["cost"]) == 7
    assert Decimal(mine["totals"]["gpu_seconds"]) == 0, "tenant A's replicas are not B's"
    refused = await plane.client(billed["key_b"]).get(
        "/v1/billing/report", params={**WINDOW, "tenant": "bill-a"})
    assert refused.status_code == 403
    as_admin = (await plane.admin.get("/v1/billing/report",
                                      params={**WINDOW, "tenant": "bill-a"})).json()
    assert as_admin["tenant_id"] == billed["a"] and as_admin["totals"]["requests"] == 6


@pytest.mark.parametrize("params", [{"group_by": "week"}, {"format": "xml"},
                                    {"from": "yesterday"}, {"colour": "red"},
                                    {"from": "2026-03-02", "to": "2026-03-01"}])
async def test_bad_report_queries_are_400(plane, billed, params):
    response = await plane.client(billed["key_a"]).get("/v1/billing/report", params=params)
    assert response.status_code == 400 and response.json()["error"]["param"]
