"""Spend budgets end to end: the API, admission's 429 before any replica, settlement from
the usage rows, release, expiry and recovery, periods, alerts, and 200 concurrent calls
over two control planes on one database. A real runtime replica, real Postgres and S3."""
import asyncio
import re
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import func, select

from controlplane.billing.metering import insert_usage
from controlplane.budgets.ledger import BudgetExceeded, Charge, Ledger
from controlplane.store.tables import BudgetAlertRow, BudgetPeriod, BudgetReservation, UsageEvent
from pool.api import QueueFull
from tests.controlplane.conftest import make_settings, running_control_plane, started_static_pool
from tests.controlplane.support.usage import make_record
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")
# dear enough that a budget of cents admits a handful of calls
PRICING = {"input_per_mtok": "1000", "cached_input_per_mtok": "1000", "output_per_mtok": "1000"}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4,
        "ignore_eos": True}
UTC = timezone.utc


@pytest.fixture(scope="module")
def settings(db_url, s3_server, tmp_path_factory):
    return make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-budgets"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pool(settings, runtime_replica):
    async with started_static_pool(settings, [runtime_replica.base_url]) as pool:
        yield pool


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(settings, pool):
    async with running_control_plane(settings, pool=pool) as plane:
        yield plane


async def new_tenant(plane, model_uri, name: str) -> tuple[str, str]:
    """A tenant with a deployment "chat" at PRICING: (its key, the key's id)."""
    key = await plane.tenant_key(name)
    await plane.set_price(tenant=name, **PRICING)
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={"name": "chat", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    keys = (await client.get("/v1/keys")).json()["data"]
    return key, next(k["id"] for k in keys if key.startswith(k["prefix"]))


async def set_budget(client, **body) -> dict:
    response = await client.put("/v1/budgets", json=body)
    assert response.status_code in (200, 201), response.text
    return response.json()


async def usage_cost(plane, tenant_id: str) -> Decimal:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return Decimal(await session.scalar(select(func.coalesce(func.sum(UsageEvent.cost), 0))
                                            .where(UsageEvent.tenant_id == tenant_id)))


async def test_operators_set_tenant_budgets_and_tenants_their_keys_and_deployments(plane, model_uri):
    key, key_id = await new_tenant(plane, model_uri, "bud-api")
    tenant = plane.client(key)
    refused = await tenant.put("/v1/budgets", json={"scope": "tenant", "limit": "100"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_only"
    made = await plane.admin.put("/v1/budgets", json={"scope": "tenant", "tenant": "bud-api", "limit": "100",
                                                      "period": "month", "time_zone": "Europe/Berlin",
                                                      "soft_fraction": 0.8})
    assert made.status_code == 201, made.text
    budget = made.json()
    assert (budget["scope"], Decimal(budget["limit"]), budget["period"], budget["time_zone"]) == (
        "tenant", Decimal(100), "month", "Europe/Berlin")
    assert Decimal(budget["spent"]) == Decimal(budget["reserved"]) == 0
    assert Decimal(budget["remaining"]) == 100 and budget["current_period"]["start"].endswith(("+00:00"))
    again = await plane.admin.put("/v1/budgets", json={"scope": "tenant", "tenant": "bud-api", "limit": "50"})
    assert again.status_code == 200 and again.json()["id"] == budget["id"]
    assert Decimal(again.json()["limit"]) == 50 and again.json()["period"] == "month"
    on_key = await set_budget(tenant, scope="key", key=key_id, limit="1", period="day")
    by_operator = await plane.admin.put("/v1/budgets", json={"scope": "deployment", "tenant": "bud-api",
                                                             "deployment": "chat", "limit": "3"})
    assert by_operator.status_code == 201 and by_operator.json()["scope_name"] == "chat"
    assert (await plane.admin.put("/v1/budgets", json={"scope": "deployment", "deployment": "chat",
                                                       "limit": "3"})).json()["error"]["param"] == "tenant"
    assert (await tenant.put("/v1/budgets", json={"scope": "key", "tenant": "bud-other", "key": key_id,
                                                  "limit": "1"})).status_code == 403
    listed = (await plane.admin.get("/v1/budgets", params={"tenant": "bud-api"})).json()["data"]
    assert {b["id"] for b in listed} == {budget["id"], on_key["id"], by_operator.json()["id"]}
    assert (await plane.admin.delete(f"/v1/budgets/{by_operator.json()['id']}")).status_code == 204
    on_chat = await set_budget(tenant, scope="deployment", deployment="chat", limit="2")
    listed = (await tenant.get("/v1/budgets")).json()["data"]
    assert {b["id"] for b in listed} == {budget["id"], on_key["id"], on_chat["id"]}
    assert (await tenant.delete(f"/v1/budgets/{budget['id']}")).status_code == 403
    missing = await tenant.put("/v1/budgets", json={"scope": "deployment", "deployment": "nope", "limit": 1})
    assert missing.status_code == 404
    bad = await tenant.put("/v1/budgets", json={"scope": "deployment", "deployment": "chat", "limit": "x"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "limit"
    other = plane.client(await plane.tenant_key("bud-other"))
    assert (await other.get(f"/v1/budgets/{on_chat['id']}")).status_code == 404
    assert (await other.delete(f"/v1/budgets/{on_chat['id']}")).status_code == 404
    assert (await other.get("/v1/budgets")).json()["data"] == []
    assert (await other.put("/v1/budgets", json={"scope": "key", "key": key_id, "limit": 1})).status_code == 404
    assert (await tenant.delete(f"/v1/budgets/{on_chat['id']}")).status_code == 204
    assert (await tenant.get(f"/v1/budgets/{on_chat['id']}")).status_code == 404
    lookups = plane.app.state.lookups
    assert lookups.has_budgets(budget["tenant_id"])
    for rest in (budget, on_key):
        assert (await plane.admin.delete(f"/v1/budgets/{rest['id']}")).status_code == 204
    assert not lookups.has_budgets(budget["tenant_id"]), "a tenant without budgets reads none"


async def test_a_call_past_a_budget_is_429_naming_it_before_any_replica(plane, pool, model_uri):
    key, _ = await new_tenant(plane, model_uri, "bud-refuse")
    client = plane.client(key)
    budget = await set_budget(client, scope="deployment", deployment="chat", limit="0.001")
    before = len(pool.calls)
    response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 50})
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "budget_exceeded"
    assert f"deployment budget {budget['id']}" in error["message"] and budget["scope_id"] in error["message"]
    assert len(pool.calls) == before, "a refused call acquired a replica"
    assert "retry-after" in response.headers
    view = (await client.get(f"/v1/budgets/{budget['id']}")).json()
    assert Decimal(view["reserved"]) == 0 and [a["kind"] for a in view["alerts"]] == ["hard"]
    tenant_id = (await client.get("/v1/budgets")).json()["data"][0]["tenant_id"]
    assert await usage_cost(plane, tenant_id) == 0, "a refused call wrote a usage row"


async def test_a_call_settles_to_its_billed_cost_and_crosses_the_soft_threshold(plane, model_uri):
    key, key_id = await new_tenant(plane, model_uri, "bud-settle")
    client = plane.client(key)
    budget = await set_budget(client, scope="key", key=key_id, limit="1", soft_amount="0.000001")
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    cost = await usage_cost(plane, budget["tenant_id"])
    assert cost > 0
    view = (await client.get(f"/v1/budgets/{budget['id']}")).json()
    assert (Decimal(view["spent"]), Decimal(view["reserved"])) == (cost, 0)
    assert Decimal(view["remaining"]) == 1 - cost
    assert [a["kind"] for a in view["alerts"]] == ["soft"]
    response = await client.post("/v1/chat/completions", json=CHAT)
    view = (await client.get(f"/v1/budgets/{budget['id']}")).json()
    assert [a["kind"] for a in view["alerts"]] == ["soft"], "one alert per budget, period and kind"
    # a budget set later starts from the period's billed usage of its scope
    billed = await usage_cost(plane, budget["tenant_id"])
    tenant_budget = await plane.admin.put("/v1/budgets", json={"scope": "tenant", "tenant": "bud-settle",
                                                               "limit": "5"})
    assert Decimal(tenant_budget.json()["spent"]) == billed == 2 * cost


async def test_a_call_the_pool_refuses_gives_its_reservation_back(plane, pool, model_uri):
    key, _ = await new_tenant(plane, model_uri, "bud-release")
    client = plane.client(key)
    budget = await set_budget(client, scope="deployment", deployment="chat", limit="1")
    pool.refuse_with = QueueFull("queue full", retry_after_s=1)
    try:
        response = await client.post("/v1/chat/completions", json=CHAT)
    finally:
        pool.refuse_with = None
    assert response.status_code == 429 and response.json()["error"]["code"] != "budget_exceeded"
    view = (await client.get(f"/v1/budgets/{budget['id']}")).json()
    assert Decimal(view["reserved"]) == 0 and Decimal(view["spent"]) == 0
    async with plane.app.state.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(BudgetReservation).where(
            BudgetReservation.budget_id == budget["id"])) == 0


class Recorder:
    def __init__(self):
        self.alerts = []

    async def crossed(self, alert) -> None:
        self.alerts.append(alert)


async def test_reservations_belong_to_their_period_expire_and_settle_once(plane, model_uri):
    """A call admitted on the last evening of a month (in Berlin) settles into that month
    even when its row lands in the next; a reservation its control plane never settled
    expires and frees the money, and the recovered row still counts, once; a row that
    held no reservation counts too."""
    key, key_id = await new_tenant(plane, model_uri, "bud-ledger")
    budget = await set_budget(plane.client(key), scope="key", key=key_id, limit="1", period="month",
                              time_zone="Europe/Berlin", soft_fraction=0.5)
    sink = Recorder()
    ledger = Ledger(plane.app.state.db_engine, sink, reservation_ttl_s=60, retention_s=3600)
    december = datetime(2026, 12, 31, 22, 30, tzinfo=UTC)          # 23:30 in Berlin
    january = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)           # 00:30 on the 1st
    tenant_id, deployment_id = budget["tenant_id"], str(uuid.uuid4())

    def charge(at, amount="0.4"):
        return Charge(str(uuid.uuid4()), tenant_id, key_id, deployment_id, Decimal(amount), at)

    late, early = charge(december), charge(january)
    assert (await ledger.reserve(late)).budgets == 1
    assert (await ledger.reserve(early)).budgets == 1
    with pytest.raises(BudgetExceeded) as refused:
        await ledger.reserve(charge(december, "0.7"))          # 0.4 held + 0.7 > 1
    assert refused.value.retry_after_s == 1.0 and refused.value.standing.budget_id == budget["id"]
    row = make_record(tenant_id=tenant_id, api_key_id=key_id, deployment_id=deployment_id,
                      cost=Decimal("0.3"), started_at=december)
    row = replace(row, invocation_id=late.invocation_id, finished_at=january + timedelta(minutes=1))
    crossed = await insert_usage(plane.app.state.db_engine, [row])
    assert await insert_usage(plane.app.state.db_engine, [row]) == [], "a row written again settles nothing"
    async with plane.app.state.sessions() as session:
        periods = {p.period_start: p for p in await session.scalars(
            select(BudgetPeriod).where(BudgetPeriod.budget_id == budget["id"]))}
    dec_start, jan_start = datetime(2026, 11, 30, 23, tzinfo=UTC), datetime(2026, 12, 31, 23, tzinfo=UTC)
    assert (periods[dec_start].spent, periods[dec_start].reserved) == (Decimal("0.3"), 0)
    assert (periods[jan_start].spent, periods[jan_start].reserved) == (0, Decimal("0.4"))
    assert crossed == [], "0.3 is below the soft threshold of 0.5"
    # the January call's control plane dies: its reservation expires and frees the money
    assert await ledger.expire(january + timedelta(seconds=59)) == 0
    assert await ledger.expire(january + timedelta(seconds=61)) == 1
    assert await ledger.expire(january + timedelta(seconds=62)) == 0
    async with plane.app.state.sessions() as session:
        jan = await session.get(BudgetPeriod, (budget["id"], jan_start), populate_existing=True)
        assert (jan.spent, jan.reserved) == (0, 0)
    # ... and the next start's journal recovery bills it: into January, once
    recovered = replace(make_record(tenant_id=tenant_id, api_key_id=key_id, deployment_id=deployment_id,
                                    cost=Decimal("0.6"), started_at=january),
                        invocation_id=early.invocation_id, recovered=True)
    crossed = await insert_usage(plane.app.state.db_engine, [recovered])
    await insert_usage(plane.app.state.db_engine, [recovered])
    async with plane.app.state.sessions() as session:
        jan = await session.get(BudgetPeriod, (budget["id"], jan_start), populate_existing=True)
        assert (jan.spent, jan.reserved) == (Decimal("0.6"), 0)
        kinds = list(await session.scalars(select(BudgetAlertRow.kind).where(
            BudgetAlertRow.budget_id == budget["id"])))
    assert [(a.kind, a.period_start, a.spent) for a in crossed] == [("soft", jan_start, Decimal("0.6"))]
    assert kinds == ["soft"]
    # a row that held no reservation (served while Postgres was away) counts in the budgets
    # that apply to it, in the period of its start; another key's row does not
    unchecked = make_record(tenant_id=tenant_id, api_key_id=key_id, deployment_id=deployment_id,
                            cost=Decimal("0.25"), started_at=december - timedelta(days=3))
    others = make_record(tenant_id=tenant_id, api_key_id=str(uuid.uuid4()), deployment_id=deployment_id,
                         cost=Decimal("0.5"), started_at=december)
    await insert_usage(plane.app.state.db_engine, [unchecked, others])
    await insert_usage(plane.app.state.db_engine, [unchecked])
    async with plane.app.state.sessions() as session:
        dec = await session.get(BudgetPeriod, (budget["id"], dec_start), populate_existing=True)
    assert (dec.spent, dec.reserved) == (Decimal("0.55"), 0)


async def test_200_concurrent_calls_on_two_control_planes_never_overshoot(plane, pool, settings, model_uri,
                                                                          tmp_path):
    """Two control planes on one database, 100 calls each at once, against one budget:
    what is billed never passes the limit by more than one call's reservation, nothing
    stays reserved, and the budget's spend is exactly the billed usage. The budget is set
    on one; the other hears of it through Postgres."""
    key, _ = await new_tenant(plane, model_uri, "bud-race")
    client = plane.client(key)
    second_settings = replace(settings, data_dir=tmp_path / "cp2")
    async with running_control_plane(second_settings, pool=pool) as second:
        budget = await set_budget(client, scope="deployment", deployment="chat", limit="0.2")
        assert plane.app.state.lookups.has_budgets(budget["tenant_id"]), "known at once where it was set"
        await eventually(lambda: second.app.state.lookups.has_budgets(budget["tenant_id"]), timeout_s=30,
                         what="the second control plane hears of the new budget")
        clients = [client, second.client(key)]
        answers = await asyncio.gather(*[clients[i % 2].post("/v1/chat/completions", json=CHAT)
                                         for i in range(200)])
        await second.flush_usage()
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {200, 429}, statuses
    refused = [a.json()["error"] for a in answers if a.status_code == 429]
    assert all(e["code"] == "budget_exceeded" for e in refused)
    reservation = max(Decimal(re.search(r"may cost up to ([0-9.]+)", e["message"]).group(1)) for e in refused)
    billed = await usage_cost(plane, budget["tenant_id"])
    assert billed <= Decimal(budget["limit"]) + reservation, (billed, reservation, statuses.count(200))
    view = (await client.get(f"/v1/budgets/{budget['id']}")).json()
    assert Decimal(view["reserved"]) == 0 and Decimal(view["spent"]) == billed
    assert statuses.count(200) >= 2, "the budget admitted calls up to its limit"
