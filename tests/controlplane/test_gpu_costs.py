"""The operator's cost book through the API, on a real Postgres: admin only (a tenant
neither reads nor writes it), each row validated, the default seeded from the settings,
the past fixed (no row in the past, no deleting a row in effect)."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio

from tests.controlplane.conftest import make_settings, running_control_plane

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-costs"),
                             gpu_cost_per_second=Decimal("0.0005"))
    async with running_control_plane(settings) as plane:
        yield plane


def later(**delta) -> str:
    return (datetime.now(timezone.utc) + timedelta(**delta)).isoformat()


async def test_the_default_is_seeded_from_the_settings(plane):
    book = (await plane.admin.get("/v1/gpu-costs")).json()
    assert [(r["gpu_kind"], r["per_gpu_second"], r["effective_from"]) for r in book["data"]] == [
        (None, "0.000500000", "1970-01-01T00:00:00+00:00")]
    assert book["in_effect"] == {"(default)": "0.000500000"}


async def test_a_tenant_neither_reads_nor_writes_the_cost_book(plane):
    tenant = plane.client(await plane.tenant_key("costs-tenant"))
    refused = [await tenant.get("/v1/gpu-costs"),
               await tenant.post("/v1/gpu-costs", json={"per_gpu_second": "0"}),
               await tenant.delete("/v1/gpu-costs/00000000-0000-0000-0000-000000000000")]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [
        (403, "admin_required")] * 3
    assert "0.0005" not in refused[0].text


@pytest.mark.parametrize("body, param", [
    ({}, "per_gpu_second"),
    ({"per_gpu_second": "-1"}, "per_gpu_second"),
    ({"per_gpu_second": "0.0000000001"}, "per_gpu_second"),        # 10 decimals
    ({"per_gpu_second": "1e9"}, "per_gpu_second"),
    ({"per_gpu_second": True}, "per_gpu_second"),
    ({"per_gpu_second": "NaN"}, "per_gpu_second"),
    ({"per_gpu_second": "1", "gpu_kind": "H100 SXM"}, "gpu_kind"),
    ({"per_gpu_second": "1", "gpu_kind": 7}, "gpu_kind"),
    ({"per_gpu_second": "1", "effective_from": "2020-01-01T00:00:00Z"}, "effective_from"),
    ({"per_gpu_second": "1", "effective_from": "soon"}, "effective_from"),
    ({"per_gpu_second": "1", "tenant": "acme"}, "tenant"),
])
async def test_a_bad_row_is_refused_naming_its_field(plane, body, param):
    refused = await plane.admin.post("/v1/gpu-costs", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == param


async def test_rows_per_kind_take_effect_at_their_time_and_only_future_ones_go(plane):
    admin = plane.admin
    now_cuda = await admin.post("/v1/gpu-costs", json={"gpu_kind": "cuda",
                                                       "per_gpu_second": "0.0011"})
    assert now_cuda.status_code == 201, now_cuda.text
    assert now_cuda.json()["per_gpu_second"] == "0.001100000"
    when = later(days=30)
    future = await admin.post("/v1/gpu-costs", json={"gpu_kind": "cuda", "per_gpu_second": 0.002,
                                                     "effective_from": when})
    assert future.status_code == 201, future.text
    again = await admin.post("/v1/gpu-costs", json={"gpu_kind": "cuda", "per_gpu_second": "9",
                                                    "effective_from": when})
    assert again.status_code == 409
    book = (await admin.get("/v1/gpu-costs")).json()
    assert [(r["gpu_kind"], r["per_gpu_second"]) for r in book["data"]] == [
        (None, "0.000500000"), ("cuda", "0.001100000"), ("cuda", "0.002000000")]
    assert book["in_effect"] == {"(default)": "0.000500000", "cuda": "0.001100000"}

    in_effect = await admin.delete(f"/v1/gpu-costs/{now_cuda.json()['id']}")
    assert in_effect.status_code == 409 and in_effect.json()["error"]["code"] == "cost_in_effect"
    assert (await admin.delete(f"/v1/gpu-costs/{future.json()['id']}")).status_code == 204
    assert (await admin.delete(f"/v1/gpu-costs/{future.json()['id']}")).status_code == 404
    assert (await admin.delete("/v1/gpu-costs/not-a-uuid")).status_code == 404
    assert len((await admin.get("/v1/gpu-costs")).json()["data"]) == 2
