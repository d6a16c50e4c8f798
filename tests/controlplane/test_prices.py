"""Operator-set prices: tenants cannot set them, admins keep a price book, usage is priced
at the price in effect when it happened and never repriced; real replica, Postgres, S3."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import UsageEvent
from controlplane.billing.pricing import Pricing, invocation_cost
from tests.controlplane.conftest import make_settings, running_control_plane

pytestmark = pytest.mark.asyncio(loop_scope="session")
OLD = {"input_per_mtok": "1", "output_per_mtok": "2"}
NEW = {"input_per_mtok": "10", "output_per_mtok": "20", "per_call": "0.5"}
OVERRIDE = {"input_per_mtok": "100", "output_per_mtok": "200"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory, runtime_replica):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-prices"))
    async with running_control_plane(settings, base_urls=[runtime_replica.base_url]) as plane:
        yield plane


def cost_of(row: UsageEvent, prices: dict) -> Decimal:
    pricing = Pricing(**{k: Decimal(v) for k, v in prices.items()})
    if "cached_input_per_mtok" not in prices:
        pricing = Pricing(**{**pricing.__dict__, "cached_input_per_mtok": pricing.input_per_mtok})
    return invocation_cost(pricing, row.prompt_tokens, row.cached_tokens, row.completion_tokens,
                           charge_call=True)


async def test_tenants_cannot_set_prices(plane, model_uri):
    client = plane.client(await plane.tenant_key("cheapskate"))
    zero = {"input_per_mtok": 0, "output_per_mtok": 0}
    for attempt in (client.post("/v1/deployments", json={
            "name": "free", "model_uri": model_uri, "pricing": zero}),
            plane.admin.post("/v1/deployments", json={
                "name": "free", "model_uri": model_uri, "pricing": zero})):
        refused = await attempt
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["param"] == "pricing"
        assert refused.json()["error"]["code"] == "price_set_by_operator"
    assert (await client.post("/v1/deployments", json={
        "name": "free", "model_uri": model_uri})).status_code == 201
    patched = await client.patch("/v1/deployments/free", json={"pricing": zero})
    assert patched.status_code == 403 and patched.json()["error"]["param"] == "pricing"
    assert (await client.post("/v1/price-book", json={"tenant": "cheapskate",
                                                      **zero})).status_code == 403


async def test_the_price_book_keeps_the_past_fixed(plane, model_uri):
    admin = plane.admin
    key = await plane.tenant_key("booked")
    await plane.client(key).post("/v1/deployments", json={"name": "chat", "model_uri": model_uri})
    past = (datetime.now(timezone.utc) - timedelta(minutes=1)).isoformat()
    soon = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    for body, status, param in [
            ({**OLD, "effective_from": past}, 422, "effective_from"),
            ({"input_per_mtok": "1"}, 422, "output_per_mtok"),
            ({**OLD, "per_call": "-1"}, 422, "per_call"),
            ({**OLD, "deployment": "chat"}, 422, "deployment"),
            ({**OLD, "tenant": "nobody"}, 404, None),
            ({**OLD, "tenant": "booked", "deployment": "nothing"}, 404, None)]:
        response = await admin.post("/v1/price-book", json=body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["param"] == param
    plan = await plane.set_price(tenant="booked", **OLD)
    assert (plan["scope"], plan["tenant"], plan["deployment"]) == ("plan", "booked", None)
    assert plan["prices"]["cached_input_per_mtok"] == "1.000000000", "defaults to input"
    override = await plane.set_price(tenant="booked", deployment="chat", effective_from=soon,
                                     **OVERRIDE)
    assert override["scope"] == "deployment"
    again = await admin.post("/v1/price-book", json={"tenant": "booked", "deployment": "chat",
                                                     "effective_from": soon, **OVERRIDE})
    assert again.status_code == 409
    book = (await admin.get("/v1/price-book", params={"tenant": "booked"})).json()["data"]
    assert [r["id"] for r in book] == [plan["id"], override["id"]]
    in_effect = await admin.delete(f"/v1/price-book/{plan['id']}")
    assert in_effect.status_code == 409 and in_effect.json()["error"]["code"] == "price_in_effect"
    assert (await admin.delete(f"/v1/price-book/{override['id']}")).status_code == 204
    assert (await admin.delete(f"/v1/price-book/{override['id']}")).status_code == 404
    assert (await admin.delete("/v1/price-book/not-a-uuid")).status_code == 404


async def call(client, request_id: str) -> None:
    response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                 json={"model": "metered", "prompt": "Hello there",
                                       "max_tokens": 3, "ignore_eos": True})
    assert response.status_code == 200, response.text


async def test_a_price_change_bills_earlier_rows_at_the_old_price_and_later_at_the_new(
        plane, model_uri):
    key = await plane.tenant_key("repriced")
    client = plane.client(key)
    await plane.set_price(tenant="repriced", **OLD)
    assert (await client.post("/v1/deployments", json={
        "name": "metered", "model_uri": model_uri})).status_code == 201
    window_from = datetime.now(timezone.utc).isoformat()
    for i in range(2):
        await call(client, f"old-{i}")
    await plane.set_price(tenant="repriced", **NEW)                 # mid-window, effective now
    for i in range(2):
        await call(client, f"new-{i}")
    await plane.set_price(tenant="repriced", deployment="metered", **OVERRIDE)
    await call(client, "override-0")
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = {r.request_id: r for r in await session.scalars(select(UsageEvent).where(
            UsageEvent.deployment_name == "metered"))}
    assert set(rows) == {"old-0", "old-1", "new-0", "new-1", "override-0"}
    for request_id, row in rows.items():
        prices = {"old": OLD, "new": NEW, "override": OVERRIDE}[request_id.split("-")[0]]
        assert row.cost == cost_of(row, prices) > 0, request_id
    report = (await client.get("/v1/billing/report", params={
        "from": window_from, "group_by": "deployment"})).json()
    assert Decimal(report["totals"]["cost"]) == sum(r.cost for r in rows.values())


async def test_a_tenant_reads_the_prices_that_apply_to_it_and_no_others(plane, model_uri):
    key = await plane.tenant_key("reader")
    client = plane.client(key)
    await plane.tenant_key("neighbour")
    await plane.set_price(tenant="neighbour", input_per_mtok="7.777", output_per_mtok="7.777")
    await plane.set_price(tenant="reader", **OLD)
    await client.post("/v1/deployments", json={"name": "chat", "model_uri": model_uri})
    await client.post("/v1/deployments", json={"name": "special", "model_uri": model_uri})
    await plane.set_price(tenant="reader", deployment="special", **OVERRIDE)
    soon = datetime.now(timezone.utc) + timedelta(days=1)
    await plane.set_price(tenant="reader", effective_from=soon.isoformat(), **NEW)
    seen = await client.get("/v1/billing/prices")
    assert seen.status_code == 200, seen.text
    body = seen.json()
    assert body["plan"]["scope"] == "plan" and body["plan"]["prices"]["input_per_mtok"] == \
        "1.000000000"
    assert {d["name"]: (d["scope"], d["prices"]["input_per_mtok"]) for d in body["deployments"]} \
        == {"chat": ("plan", "1.000000000"), "special": ("deployment", "100.000000000")}
    assert [(s["scope"], s["prices"]["per_call"]) for s in body["scheduled"]] == \
        [("plan", "0.500000000")]
    assert "7.777" not in seen.text and "neighbour" not in seen.text
    no_scope = plane.client(await plane.tenant_key("reader", scopes=["invoke"]))
    assert (await no_scope.get("/v1/billing/prices")).status_code == 403
