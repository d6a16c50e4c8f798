"""Bills per LoRA adapter, against a real Postgres and S3: the price book's adapter rows
(over the base's price, which is also their default), a shared base's catalogue price for
every caller, the admin route's refusals, and reports grouped by adapter whose GPU time is
each base replica's, shared out by tokens, with the same totals as by deployment.

Tenant ad-op (the operator's) owns the shared base `catalogue` and the bare shared base
`bare`; ad-ann owns `own` with adapters fr, fr2 (no price row) and old (deleted), and the
adapters de and dx on `catalogue`; ad-bob has the adapter es on `catalogue`."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import csv
import io

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.billing.pricing import Pricing
from controlplane.store import deployments, prices
from controlplane.store.desired_state import PostgresReplicaEvents
from controlplane.store.tables import Adapter, Tenant
from pool.api import ReplicaEvent
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.usage import make_record
from tests.controlplane.test_billing import assert_rows_add_up

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
    revisions = {}
    for tenant, name in [("ad-op", "catalogue"), ("ad-op", "bare"), ("ad-ann", "own")]:
        created = await plane.client(keys[tenant]).post(
            "/v1/deployments", json={"name": name, "model_uri": model_uri})
        assert created.status_code == 201, created.text
        revisions[name] = created.json()["revisions"][0]["id"]
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
    return {"keys": keys, "tenants": tenants, "ids": ids, "revisions": revisions}


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


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def billed(plane, world):
    """Usage through the real UsageWriter and lifetimes through the replica-event sink, on
    June 1st 2025. Replica cat-1 of ad-op's catalogue held 1 GPU for 1000 s at 7e-9 a
    GPU-second (its override then) and served 15 tokens of ad-op's base, 30 of ann's de
    and 45 of bob's es. Replica own-1 of ann's `own` held 2 GPUs for 600 s at the default
    0.001 and served 7 tokens of the base and 13 + 3 of fr (and 1000 of fr the minute
    before the window: not counted); own-2 held 1 GPU for 60 s and served nothing; fr2's
    call ran on a replica with no lifetime."""
    tenants, ids = world["tenants"], world["ids"]
    async with plane.app.state.sessions.begin() as session:
        await prices.add(session, Pricing(gpu_second=Decimal("0.000000007")),
                         DAY1 - timedelta(days=1), await session.get(Tenant, tenants["ad-op"]),
                         await deployments.find(session, tenants["ad-op"], "catalogue"))
    sink = PostgresReplicaEvents(plane.app.state.sessions)
    for replica_id, base, gpus, start, seconds in [("cat-1", "catalogue", 1, 60, 1000),
                                                   ("own-1", "own", 2, 120, 600),
                                                   ("own-2", "own", 1, 180, 60)]:
        common = dict(replica_id=replica_id, revision_id=world["revisions"][base],
                      deployment_id=ids[base], tenant_id=tenants["ad-op" if base == "catalogue"
                                                                 else "ad-ann"],
                      gpu_count=gpus, slot_ids=tuple(f"gpu{i}" for i in range(gpus)))
        placed = DAY1 + timedelta(minutes=start)
        await sink.replica_changed(ReplicaEvent(state="pulling", at=placed, **common))
        await sink.replica_changed(ReplicaEvent(
            state="stopped", at=placed + timedelta(seconds=seconds), **common))
    writer = plane.app.state.writer
    for tenant, base, replica, adapter, prompt, completion, cost, minute in [
            ("ad-op", "catalogue", "cat-1", None, 10, 5, "0.1", 61),
            ("ad-ann", "catalogue", "cat-1", "de", 20, 10, "0.2", 62),
            ("ad-bob", "catalogue", "cat-1", "es", 40, 5, "0.3", 63),
            ("ad-ann", "own", "own-1", None, 5, 2, "0.01", 121),
            ("ad-ann", "own", "own-1", "fr", 10, 3, "0.02", 122),
            ("ad-ann", "own", "own-1", "fr", 2, 1, "0.03", 123),
            ("ad-ann", "own", "own-1", "fr", 1000, 0, "99", -1),
            ("ad-ann", "own", "elsewhere", "fr2", 2, 2, "0.04", 124)]:
        writer.submit(make_record(
            tenant_id=tenants[tenant], deployment_id=ids[base], deployment_name=base,
            replica_id=replica, adapter_id=ids[adapter] if adapter else None,
            adapter_name=adapter, prompt_tokens=prompt, completion_tokens=completion,
            cost=Decimal(cost), started_at=DAY1 + timedelta(minutes=minute)))
    await plane.flush_usage()


async def report(plane, world, tenant: str, group_by: str, fmt: str = "json"):
    response = await plane.client(world["keys"][tenant]).get(
        "/v1/billing/report", params={**WINDOW, "group_by": group_by, "format": fmt})
    assert response.status_code == 200, response.text
    return response.json() if fmt == "json" else list(csv.DictReader(io.StringIO(response.text)))


def gpu_of(body) -> dict:
    return {r["key"]: (r["requests"], r["gpu_seconds"], r["gpu_cost"]) for r in body["rows"]}


async def test_a_replicas_gpu_time_is_shared_out_by_tokens_and_an_idle_ones_stays_the_bases(
        plane, world, billed):
    """own-1: 1200 s (1.2) cut 7:16 is 365.217391 s and 834.782608 s, 1e-6 s short: the
    largest share, fr's, takes it (and the 1e-15 its cost was short); own-2's 60 s stay
    with the base. cat-1: 1000 s cut 15:75 (other tenants' tokens count, under one key)."""
    ann = await report(plane, world, "ad-ann", "adapter")
    assert gpu_of(ann) == {
        "own": (1, "425.217391", "0.425217391304347"),
        "own:fr": (2, "834.782609", "0.834782608695653"),
        "own:fr2": (1, "0.000000", "0.000000000000000"),
        "catalogue:de": (1, "0.000000", "0.000000000000000")}
    op = await report(plane, world, "ad-op", "adapter")
    assert gpu_of(op) == {
        "catalogue": (1, "166.666666", "0.000001166666666"),
        "catalogue:(other tenants)": (0, "833.333334", "0.000005833333334")}


@pytest.mark.parametrize("tenant", ["ad-op", "ad-ann", "ad-bob"])
async def test_by_adapter_the_totals_are_those_by_deployment_in_json_and_csv(plane, world,
                                                                             billed, tenant):
    by_adapter = await report(plane, world, tenant, "adapter")
    by_deployment = await report(plane, world, tenant, "deployment")
    assert by_adapter["totals"] == by_deployment["totals"]
    assert by_adapter["gpu"] == by_deployment["gpu"]
    assert_rows_add_up(by_adapter["rows"], by_adapter["totals"])
    lines = await report(plane, world, tenant, "adapter", "csv")
    assert [line["key"] for line in lines] == [r["key"] for r in by_adapter["rows"]] + ["TOTAL"]
    assert {k: str(v) for k, v in by_adapter["totals"].items()} == \
        {k: v for k, v in lines[-1].items() if k != "key"}
    assert_rows_add_up(lines[:-1], lines[-1])
    if tenant == "ad-ann":
        totals = by_adapter["totals"]
        assert (totals["requests"], totals["prompt_tokens"], totals["completion_tokens"]) == \
            (5, 39, 18)
        assert (totals["gpu_seconds"], totals["gpu_cost"]) == ("1260.000000", "1.260000000000000")
        assert totals["token_cost"] == "0.300000000000000"


async def test_another_tenants_report_never_shows_the_firsts_adapters(plane, world, billed):
    bob = await report(plane, world, "ad-bob", "adapter")
    assert [(r["key"], r["requests"], r["gpu_seconds"]) for r in bob["rows"]] == [
        ("catalogue:es", 1, "0.000000")], "its own adapter; the GPU time is the base owner's"
    for tenant in ("ad-op", "ad-bob"):
        for group_by in ("adapter", "deployment"):
            text = str(await report(plane, world, tenant, group_by))
            assert ":de'" not in text and ":fr" not in text and "own" not in text, (tenant, text)
    op = str(await report(plane, world, "ad-op", "adapter"))
    assert ":es'" not in op, "other tenants' calls on the shared base are one row, unnamed"
    as_admin = await plane.admin.get("/v1/billing/report", params={
        **WINDOW, "group_by": "adapter", "tenant": "ad-bob"})
    assert [r["key"] for r in as_admin.json()["rows"]] == ["catalogue:es"]
