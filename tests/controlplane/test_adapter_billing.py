"""Bills per LoRA adapter, against a real Postgres and S3: the price book's adapter rows
(over the base's price, which is also their default), a shared base's catalogue price for
every caller, the admin route's refusals, and reports grouped by adapter whose GPU time is
each base replica's, shared out by tokens, with the same totals as by deployment.

Tenant ad-op (the operator's) owns the shared base `catalogue` and the bare shared base
`bare`; ad-ann owns `own` with adapters fr, fr2 (no price row) and old (deleted), and the
adapters de and dx on `catalogue`; ad-bob has the adapter es on `catalogue`."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store import deployments
from controlplane.store.tables import Adapter, Tenant
from tests.controlplane.conftest import make_settings, running_control_plane

pytestmark = pytest.mark.asyncio(loop_scope="session")
UTC = timezone.utc
DAY1 = datetime(2025, 6, 1, tzinfo=UTC)            # long before any row the API adds (now)
WINDOW = {"from": "2025-06-01T00:00:00Z", "to": "2025-06-02T00:00:00Z"}
PRICE = {"output_per_mtok": "1"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-adapter-bill"),
                             price_input_per_mtok=Decimal(1), price_gpu_second=Decimal("0.001"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(plane, model_uri):
    """The tenants, their keys, deployments and adapters (adapters written to their table
    directly: the attach route is not this module's subject)."""
    keys = {name: await plane.tenant_key(name) for name in ("ad-op", "ad-ann", "ad-bob")}
    for tenant, name in [("ad-op", "catalogue"), ("ad-op", "bare"), ("ad-ann", "own")]:
        created = await plane.client(keys[tenant]).post(
            "/v1/deployments", json={"name": name, "model_uri": model_uri})
        assert created.status_code == 201, created.text
    ids: dict[str, str] = {}
    async with plane.app.state.sessions.begin() as session:
        tenants = {t.name: t.id for t in await session.scalars(select(Tenant))}
        for tenant, name in [("ad-op", "catalogue"), ("ad-op", "bare"), ("ad-ann", "own")]:
            deployment = await deployments.find(session, tenants[tenant], name)
            deployment.shared = tenant == "ad-op"
            ids[name] = deployment.id
        for tenant, name, base in [("ad-ann", "fr", "own"), ("ad-ann", "fr2", "own"),
                                   ("ad-ann", "old", "own"), ("ad-ann", "de", "catalogue"),
                                   ("ad-ann", "dx", "catalogue"), ("ad-bob", "es", "catalogue")]:
            adapter = Adapter(tenant_id=tenants[tenant], name=name, deployment_id=ids[base],
                              adapter_uri=f"s3://cp-models/adapters/{name}/", rank=8,
                              target_modules=["q_proj", "v_proj"], weight_bytes=1024,
                              pinned_objects={},
                              deleted_at=DAY1 if name == "old" else None)
            session.add(adapter)
            await session.flush()
            ids[name] = adapter.id
    return {"keys": keys, "tenants": tenants, "ids": ids}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def priced(plane, world):
    """Through the admin API, in effect now: the default input price is 1; ad-op's plan 8
    and its catalogue override 7; ad-ann's plan 2, its `own` override 3, fr's row 5 and
    de's row 6."""
    rows = {}
    for name, body in [("op-plan", dict(tenant="ad-op", input_per_mtok="8")),
                       ("catalogue", dict(tenant="ad-op", deployment="catalogue", input_per_mtok="7")),
                       ("ann-plan", dict(tenant="ad-ann", input_per_mtok="2")),
                       ("own", dict(tenant="ad-ann", deployment="own", input_per_mtok="3")),
                       ("fr", dict(tenant="ad-ann", adapter="fr", input_per_mtok="5")),
                       ("de", dict(tenant="ad-ann", adapter="de", deployment="catalogue",
                                   input_per_mtok="6"))]:
        rows[name] = await plane.set_price(**body, **PRICE)
    return rows


def input_price(plane, world, tenant: str, deployment: str, adapter: str | None = None) -> Decimal:
    """What the gateway would price a call at now, from memory."""
    ids = world["ids"]
    return plane.app.state.lookups.pricing(
        world["tenants"][tenant], ids[deployment], datetime.now(UTC),
        ids[adapter] if adapter else None).input_per_mtok


async def test_an_adapters_row_applies_over_its_base_and_its_default_is_the_base_price(
        plane, world, priced):
    assert (priced["fr"]["scope"], priced["fr"]["deployment"], priced["fr"]["adapter"]) == \
        ("adapter", "own", "fr")
    assert input_price(plane, world, "ad-ann", "own", "fr") == 5, "the adapter's row"
    assert input_price(plane, world, "ad-ann", "own", "fr2") == 3, "no row: the base's price"
    assert input_price(plane, world, "ad-ann", "own") == 3, "the base model: the override"


async def test_a_shared_bases_price_applies_to_every_callers_call_and_its_owners_plan_to_none(
        plane, world, priced):
    assert (priced["de"]["tenant"], priced["de"]["deployment"]) == ("ad-ann", "catalogue")
    assert input_price(plane, world, "ad-ann", "catalogue", "de") == 6, "ann's adapter row"
    assert input_price(plane, world, "ad-ann", "catalogue", "dx") == 7, "ad-op's override"
    assert input_price(plane, world, "ad-bob", "catalogue", "es") == 7, "for every caller"
    assert input_price(plane, world, "ad-bob", "catalogue") == 7
    assert input_price(plane, world, "ad-bob", "bare", "es") == 1, "the default, never op's plan"
    assert input_price(plane, world, "ad-ann", "bare") == 2, "the caller's own plan"
    assert input_price(plane, world, "ad-op", "bare") == 8


@pytest.mark.parametrize("body, status, code, param", [
    (dict(adapter="fr"), 422, "invalid_field", "adapter"),
    (dict(tenant="ad-ann", adapter=5), 422, "invalid_field", "adapter"),
    (dict(tenant="ad-ann", adapter="nope"), 404, "adapter_not_found", None),
    (dict(tenant="ad-bob", adapter="fr"), 404, "adapter_not_found", None),
    (dict(tenant="ad-ann", adapter="old"), 404, "adapter_not_found", None),
    (dict(tenant="ad-ann", adapter="fr", deployment="catalogue"), 400, "adapter_base_mismatch",
     "deployment"),
    (dict(tenant="ad-ann", adapter="de", deployment="own"), 400, "adapter_base_mismatch",
     "deployment"),
])
async def test_the_price_route_refuses_an_adapter_it_cannot_resolve(plane, world, body, status,
                                                                      code, param):
    response = await plane.admin.post("/v1/price-book", json={**body, "input_per_mtok": "1",
                                                              **PRICE})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


async def test_the_book_shows_adapter_rows_and_tenants_read_only_their_own(plane, world, priced):
    soon = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    later = await plane.set_price(tenant="ad-ann", adapter="fr", effective_from=soon,
                                  input_per_mtok="4", **PRICE)
    again = await plane.admin.post("/v1/price-book", json={
        "tenant": "ad-ann", "adapter": "fr", "effective_from": soon, "input_per_mtok": "4",
        **PRICE})
    assert again.status_code == 409, again.text
    book = (await plane.admin.get("/v1/price-book", params={"tenant": "ad-ann"})).json()["data"]
    assert [(r["scope"], r["deployment"], r["adapter"]) for r in book] == [
        ("plan", None, None), ("adapter", "catalogue", "de"), ("deployment", "own", None),
        ("adapter", "own", "fr"), ("adapter", "own", "fr")]
    bob_book = (await plane.admin.get("/v1/price-book", params={"tenant": "ad-bob"})).json()
    assert bob_book["data"] == []
    ann = (await plane.client(world["keys"]["ad-ann"]).get("/v1/billing/prices")).json()
    assert {a["name"]: (a["deployment"], a["scope"], a["prices"]["input_per_mtok"])
            for a in ann["adapters"]} == {
        "de": ("catalogue", "adapter", "6.000000000"), "dx": ("catalogue", "deployment", "7.000000000"),
        "fr": ("own", "adapter", "5.000000000"), "fr2": ("own", "deployment", "3.000000000")}
    assert [(s["deployment"], s["adapter"]) for s in ann["scheduled"]] == [("own", "fr")]
    bob = await plane.client(world["keys"]["ad-bob"]).get("/v1/billing/prices")
    assert [(a["name"], a["deployment"], a["prices"]["input_per_mtok"])
            for a in bob.json()["adapters"]] == [("es", "catalogue", "7.000000000")]
    assert '"fr"' not in bob.text and '"de"' not in bob.text and "6.000000000" not in bob.text
    assert (await plane.admin.delete(f"/v1/price-book/{later['id']}")).status_code == 204
