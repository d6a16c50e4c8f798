"""The margin report (GET /v1/billing/margin) over a small history written through the
product's own paths (tests/controlplane/support/margin_history.py: its docstring tells
where each figure below comes from), on a real Postgres; every figure checked to the
digit, by deployment and by tenant, in JSON and CSV; a tenant refused."""
import csv
import io

import pytest
import pytest_asyncio

from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.margin_history import SETTINGS, WINDOW, write_history

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-margin"), **SETTINGS)
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(plane, model_uri):
    return await write_history(plane, model_uri)


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
