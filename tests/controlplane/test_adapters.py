"""Adapters in the control plane, on real Postgres and real S3: real PEFT adapters of the
tiny llama attached to a base deployed with adapter slots (no replica starts), their
views, each tenant's adapters hidden from the others both ways, a base shared by the
operator, and every refusal of the attach, each naming its field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import Adapter
from tests.controlplane.conftest import MODELS_BUCKET, make_settings, running_control_plane
from tests.support.peft_adapters import make_adapter
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(400)]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-adapters"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest.fixture(scope="module")
def folders(tiny_model, model_factory, tmp_path_factory) -> dict[str, Path]:
    """Adapters as PEFT saves them: of the tiny llama at rank 8 and 32, and of a llama of
    other sizes."""
    tmp = tmp_path_factory.mktemp("peft")
    other = model_factory(arch="llama", hidden_size=32, intermediate_size=64)
    return {"r8": make_adapter(tiny_model, tmp / "r8", 8, ALL, seed=1),
            "r32": make_adapter(tiny_model, tmp / "r32", 32, ["q_proj", "v_proj"], seed=2),
            "other": make_adapter(other, tmp / "other", 4, ["q_proj"], seed=3)}


def upload(s3_server, folder: Path, prefix: str) -> str:
    return upload_model(folder, s3_server.client(), MODELS_BUCKET, prefix)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenants(plane, s3_server, tiny_model, folders):
    """Tenants ad-a and ad-b, each with the tiny llama and the rank-8 adapter under its own
    source, and A's base `base` deployed with two adapter slots."""
    keys = {t: await plane.tenant_key(t) for t in ("ad-a", "ad-b")}
    for tenant in keys:
        upload(s3_server, tiny_model, f"{tenant}/llama")
        upload(s3_server, folders["r8"], f"{tenant}/support")
    a = plane.client(keys["ad-a"])
    made = await a.post("/v1/deployments", json=deployment("base", "ad-a", max_loras=2))
    assert made.status_code == 201, made.text
    return keys


def deployment(name: str, tenant: str, model: str = "llama", gpus: int = 1, **engine) -> dict:
    return {"name": name, "model_uri": f"s3://{MODELS_BUCKET}/{tenant}/{model}/",
            "resources": {"gpu_memory_gb": 2, "gpu_count": gpus}, "engine": engine}


def attach(name: str, base: str, tenant: str, folder: str = "support") -> dict:
    return {"name": name, "base": base, "adapter_uri": f"s3://{MODELS_BUCKET}/{tenant}/{folder}/"}


def refused(response, status: int, param: str | None = None, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert param is None or error["param"] == param, error
    assert code is None or error["code"] == code, error
    return error["message"]


async def test_attach_view_list_get_delete(plane, tenants, folders):
    a = plane.client(tenants["ad-a"])
    made = await a.post("/v1/adapters", json=attach("support", "base", "ad-a"))
    assert made.status_code == 201, made.text
    view = made.json()
    weights = folders["r8"] / "adapter_model.safetensors"
    uri = f"s3://{MODELS_BUCKET}/ad-a/support/"
    assert set(view) == {"id", "name", "base", "base_shared", "model", "adapter_uri", "rank",
                         "target_modules", "weight_bytes", "created_at"}
    assert (view["name"], view["base"], view["base_shared"], view["model"]) == \
        ("support", "base", False, "base:support")
    assert (view["adapter_uri"], view["rank"], view["target_modules"], view["weight_bytes"]) == \
        (uri, 8, ALL, weights.stat().st_size)
    assert (await a.get("/v1/adapters/support")).json() == view
    assert (await a.get("/v1/adapters")).json() == {"object": "list", "data": [view]}
    async with plane.app.state.sessions() as session:
        row = await session.scalar(select(Adapter).where(Adapter.id == view["id"]))
    assert set(row.pinned_objects) == {f"{uri}adapter_config.json", f"{uri}adapter_model.safetensors"}
    assert row.pinned_objects[f"{uri}adapter_model.safetensors"]["size"] == weights.stat().st_size
    assert all(p["etag"] for p in row.pinned_objects.values())

    again = await a.post("/v1/adapters", json=attach("support", "base", "ad-a"))
    refused(again, 409, code="adapter_exists")
    deleted = await a.delete("/v1/adapters/support")
    assert deleted.status_code == 200 and deleted.json() == {"id": view["id"], "name": "support",
                                                             "deleted": True}
    refused(await a.get("/v1/adapters/support"), 404, code="adapter_not_found")
    refused(await a.delete("/v1/adapters/support"), 404)
    assert (await a.get("/v1/adapters")).json() == {"object": "list", "data": []}
    remade = await a.post("/v1/adapters", json=attach("support", "base", "ad-a"))
    assert remade.status_code == 201 and remade.json()["id"] != view["id"], "the name is free again"
    assert (await a.get("/v1/deployments/base")).json()["shared"] is False


async def test_tenants_never_see_each_others_adapters_and_share_only_what_the_operator_shares(
        plane, tenants):
    a, b = plane.client(tenants["ad-a"]), plane.client(tenants["ad-b"])
    mine = await a.post("/v1/adapters", json=attach("mine", "base", "ad-a"))
    assert mine.status_code == 201, mine.text
    for call in (b.get("/v1/adapters/mine"), b.delete("/v1/adapters/mine")):
        refused(await call, 404, code="adapter_not_found")
    assert "mine" not in [x["name"] for x in (await b.get("/v1/adapters")).json()["data"]]
    assert (await a.get("/v1/adapters/mine")).status_code == 200, "B's delete did nothing"
    # A's base is A's alone until the operator shares it: 404, as for any other name
    refused(await b.post("/v1/adapters", json=attach("bees", "base", "ad-b")), 404,
            code="deployment_not_found")
    refused(await a.patch("/v1/tenants/ad-a/deployments/base", json={"shared": True}), 403,
            code="admin_required")
    refused(await a.patch("/v1/deployments/base", json={"shared": True}), 422, param="shared")
    shared = await plane.admin.patch("/v1/tenants/ad-a/deployments/base", json={"shared": True})
    assert shared.status_code == 200 and shared.json()["shared"] is True, shared.text

    bees = await b.post("/v1/adapters", json=attach("bees", "base", "ad-b"))
    assert bees.status_code == 201, bees.text
    assert (bees.json()["base"], bees.json()["base_shared"], bees.json()["model"]) == ("base", True, "base:bees")
    # the base's owner sees none of the adapters other tenants attach to it
    assert [x["name"] for x in (await a.get("/v1/adapters")).json()["data"]] == ["mine", "support"]
    refused(await a.get("/v1/adapters/bees"), 404)
    refused(await a.delete("/v1/adapters/bees"), 404)
    # B still may not read A's files: the shared base is A's, its adapter URIs are not
    refused(await b.post("/v1/adapters", json=attach("thief", "base", "ad-a")), 403,
            param="adapter_uri", code="model_source_denied")

    # B's own deployment of that name shadows the shared one (and has no adapter slots)
    own = await b.post("/v1/deployments", json=deployment("base", "ad-b"))
    assert own.status_code == 201, own.text
    message = refused(await b.post("/v1/adapters", json=attach("bees-2", "base", "ad-b")), 422,
                      param="base")
    assert "max_loras" in message
    # one shared deployment per name: the name says which base it is
    refused(await plane.admin.patch("/v1/tenants/ad-b/deployments/base", json={"shared": True}),
            409, code="shared_name_taken")
    unshared = await plane.admin.patch("/v1/tenants/ad-a/deployments/base", json={"shared": False})
    assert unshared.json()["shared"] is False
    assert (await b.get("/v1/adapters/bees")).json()["base_shared"] is False
    for body, param in (({}, "shared"), ({"shared": "yes"}, "shared"), ({"shared": True, "x": 1}, "x")):
        refused(await plane.admin.patch("/v1/tenants/ad-a/deployments/base", json=body), 422, param=param)
    refused(await plane.admin.patch("/v1/tenants/ad-a/deployments/nope", json={"shared": True}), 404)
    refused(await plane.admin.patch("/v1/tenants/nobody/deployments/base", json={"shared": True}), 404)


async def test_the_adapter_is_refused_by_the_field_it_breaks(plane, tenants, s3_server, folders):
    a = plane.client(tenants["ad-a"])
    upload(s3_server, folders["r32"], "ad-a/rank32")
    upload(s3_server, folders["other"], "ad-a/other")
    s3_server.client().put_object(Bucket=MODELS_BUCKET, Key="ad-a/half/adapter_config.json",
                                  Body=(folders["r8"] / "adapter_config.json").read_bytes())
    message = refused(await a.post("/v1/adapters", json=attach("big", "base", "ad-a", "rank32")),
                      422, param="r", code="invalid_field")
    assert message == "r: rank 32 is above this base's max_lora_rank (16)"
    message = refused(await a.post("/v1/adapters", json=attach("alien", "base", "ad-a", "other")),
                      422, param="adapter_model.safetensors")
    assert "another base model" in message
    message = refused(await a.post("/v1/adapters", json=attach("half", "base", "ad-a", "half")),
                      422, param="adapter_model.safetensors")
    assert "missing" in message
    message = refused(await a.post("/v1/adapters", json=attach("none", "base", "ad-a", "nothing")),
                      422, param="adapter_config.json")
    assert "missing" in message
    # a base whose slots hold rank 32 takes it
    wide = await a.post("/v1/deployments", json=deployment("wide", "ad-a", max_loras=1, max_lora_rank=32))
    assert wide.status_code == 201, wide.text
    big = await a.post("/v1/adapters", json=attach("big", "wide", "ad-a", "rank32"))
    assert big.status_code == 201 and big.json()["rank"] == 32, big.text
    assert big.json()["target_modules"] == ["q_proj", "v_proj"]
    assert [x["name"] for x in (await a.get("/v1/adapters")).json()["data"]] == ["big", "mine", "support"]


async def test_a_base_that_cannot_take_adapters_is_refused(plane, tenants, s3_server, model_factory):
    a = plane.client(tenants["ad-a"])
    upload(s3_server, model_factory(arch="phi3"), "ad-a/phi3")
    created = await a.post("/v1/deployments", json=deployment("plain", "ad-a"))
    assert created.status_code == 201, created.text
    message = refused(await a.post("/v1/adapters", json=attach("on-plain", "plain", "ad-a")), 422,
                      param="base")
    assert "engine max_loras" in message, message
    # a base whose slots could never hold an adapter is refused when it is deployed
    for made, words in ((deployment("split", "ad-a", gpus=2, max_loras=2), "one rank"),
                        (deployment("phi", "ad-a", model="phi3", max_loras=2), "do not run on Phi3ForCausalLM")):
        message = refused(await a.post("/v1/deployments", json=made), 422, param="engine.max_loras")
        assert words in message, message
    refused(await a.post("/v1/adapters", json=attach("lost", "no-such-base", "ad-a")), 404,
            code="deployment_not_found")
    # a canary revision without slots takes traffic: the base cannot take adapters now
    canary = await a.patch("/v1/deployments/wide", json={"engine": {"max_loras": None}, "promote": False})
    assert canary.status_code == 200, canary.text
    split = await a.post("/v1/deployments/wide/traffic", json={"r1": 90, "r2": 10})
    assert split.status_code == 200, split.text
    refused(await a.post("/v1/adapters", json=attach("canary", "wide", "ad-a")), 422, param="base")


async def test_names_and_bodies(plane, tenants, s3_server):
    a, b = plane.client(tenants["ad-a"]), plane.client(tenants["ad-b"])
    # one namespace per tenant: an adapter may not take a deployment's name, nor the reverse
    refused(await a.post("/v1/adapters", json=attach("base", "base", "ad-a")), 409, code="name_taken")
    refused(await a.post("/v1/deployments", json=deployment("mine", "ad-a")), 409, code="name_taken")
    # ... but another tenant's names are not in it
    theirs = await b.post("/v1/deployments", json=deployment("mine", "ad-b"))
    assert theirs.status_code == 201, theirs.text
    reads = len(plane.app.state.pool.s3_requests)
    outside = attach("stolen", "base", "ad-a") | {"adapter_uri": f"s3://{MODELS_BUCKET}/ad-b/support/"}
    refused(await a.post("/v1/adapters", json=outside), 403, param="adapter_uri", code="model_source_denied")
    for body, param in (
            ({"base": "base", "adapter_uri": "s3://b/x/"}, "name"),
            ({**attach("x", "base", "ad-a"), "rank": 4}, "rank"),
            ({**attach("x", "base", "ad-a"), "name": "Has Caps"}, "name"),
            ({**attach("x", "base", "ad-a"), "base": 7}, "base"),
            ({**attach("x", "base", "ad-a"), "adapter_uri": "http://bucket/a/"}, "adapter_uri"),
            ({**attach("x", "base", "ad-a"), "adapter_uri": "s3://cp-models/ad-a/../ad-b/"}, "adapter_uri")):
        refused(await a.post("/v1/adapters", json=body), 422, param=param)
    refused(await a.post("/v1/adapters", content=b"not json"), 400)
    refused(await a.get("/v1/adapters/Not%20A%20Name"), 404)
    assert plane.app.state.pool.s3_requests[reads:] == [], "a refused attach reads nothing"
    listed = json.dumps((await a.get("/v1/deployments")).json())
    assert '"shared": false' in listed


async def test_deleting_a_base_deletes_the_adapters_on_it_whoevers_they_are(plane, tenants):
    a, b = plane.client(tenants["ad-a"]), plane.client(tenants["ad-b"])
    made = await a.post("/v1/deployments", json=deployment("doomed", "ad-a", max_loras=2))
    assert made.status_code == 201, made.text
    assert (await plane.admin.patch("/v1/tenants/ad-a/deployments/doomed", json={"shared": True})).status_code == 200
    for client, tenant, name in ((a, "ad-a", "on-doomed"), (b, "ad-b", "b-on-doomed")):
        attached = await client.post("/v1/adapters", json=attach(name, "doomed", tenant))
        assert attached.status_code == 201, attached.text
    assert (await a.delete("/v1/deployments/doomed")).status_code == 204
    refused(await a.get("/v1/adapters/on-doomed"), 404)
    refused(await b.get("/v1/adapters/b-on-doomed"), 404)
    assert "b-on-doomed" not in [x["name"] for x in (await b.get("/v1/adapters")).json()["data"]]
    # the names are free again, and the base's name too
    again = await a.post("/v1/deployments", json=deployment("on-doomed", "ad-a"))
    assert again.status_code == 201, again.text
