"""The isolation matrix: every route of the app x {own tenant, other tenant, no key, wrong
scope, revoked key, expired key, admin}, the status of each cell asserted, and no cell that
is not tenant A's own (or the admin's) shows A's names, prices, numbers or adapters.

The routes come from the app's route table and must equal ROUTES below, so a new route
fails here until its row says who may call it and what each caller gets. Real Postgres,
real S3 (A's model and an upload), a real runtime replica for the invocations.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

import httpx
import pytest
import pytest_asyncio

from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.routes import every_route
from tests.support.peft_adapters import make_adapter
from tests.support.model_factory import upload_model
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
TENANT_SCOPES = ("deploy", "invoke", "billing:read")
A_PRICE = "3.141592653"                       # A's plan: a number no other cell may show
CELLS = ("anonymous", "revoked", "expired", "wrong_scope", "other", "admin", "own")
fresh = itertools.count()


@dataclass
class World:
    """Tenant A's keys and resources, tenant B's key, and the admin's."""
    keys: dict[str, str] = field(default_factory=dict)        # cell -> key (not wrong_scope)
    wrong: dict[str, str] = field(default_factory=dict)       # scope -> A key lacking it
    ids: dict[str, str] = field(default_factory=dict)
    completion: dict[str, Any] = field(default_factory=dict)
    markers: set[str] = field(default_factory=set)           # what only A and the admin may see
    doomed_budgets: list[str] = field(default_factory=list)   # one for each cell to delete
    doomed_webhooks: list[str] = field(default_factory=list)  # one of A's endpoints per cell


Request = Callable[[World], tuple[str, Optional[dict]]]


@dataclass(frozen=True)
class Case:
    access: str                  # public | metrics | a scope | admin
    request: Request             # the path and JSON body, aimed at A's resources
    own: int = 200               # A's key with every tenant scope
    other: int = 404             # B's key with every tenant scope
    admin: int = 404             # the admin (its own tenant: none of A's resources)


def fixed(path: str, body: Optional[dict] = None) -> Request:
    return lambda world: (path, body)


def unique_tenant(world: World) -> tuple[str, dict]:
    return "/v1/tenants", {"name": f"iso-new-{next(fresh)}"}


def unique_grant(world: World) -> tuple[str, dict]:
    return "/v1/model-sources", {"prefix": f"s3://cp-models/iso-shared-{next(fresh)}/"}


def unique_price(world: World) -> tuple[str, dict]:
    later = datetime.now(timezone.utc) + timedelta(days=30, minutes=next(fresh))
    return "/v1/price-book", {"tenant": "iso-a", "input_per_mtok": "1", "output_per_mtok": "1",
                              "effective_from": later.isoformat()}


def unique_gpu_cost(world: World) -> tuple[str, dict]:
    later = datetime.now(timezone.utc) + timedelta(days=30, minutes=next(fresh))
    return "/v1/gpu-costs", {"gpu_kind": "cuda", "per_gpu_second": "0.001",
                             "effective_from": later.isoformat()}


def unique_deployment(world: World) -> tuple[str, dict]:
    return "/v1/deployments", {"name": f"iso-new-{next(fresh)}", "model_uri": world.ids["model"]}


def unique_adapter(world: World) -> tuple[str, dict]:
    return "/v1/adapters", {"name": f"iso-ad-{next(fresh)}", "base": "iso-lora",
                            "adapter_uri": world.ids["adapter"]}


def unique_upload(world: World) -> tuple[str, dict]:
    return "/v1/models/uploads", {"name": f"iso-up-{next(fresh)}",
                                  "files": [{"path": "config.json", "size": 10}]}


def unique_webhook(world: World) -> tuple[str, dict]:
    return "/v1/webhooks", {"url": f"http://127.0.0.1:9/iso-{next(fresh)}", "event_types": ["*"]}


def next_doomed_webhook(world: World) -> tuple[str, None]:
    """One of A's endpoints per cell, so that each cell's delete has its own to try."""
    return f"/v1/webhooks/{world.doomed_webhooks.pop(0)}", None


def path_with(template: str, name: str) -> Request:
    return lambda world: (template.format(world.ids[name]), None)


def doomed_budget(world: World) -> tuple[str, None]:
    """A budget of A's not yet deleted: each cell's DELETE aims at its own."""
    return f"/v1/budgets/{world.doomed_budgets.pop()}", None


def completion(world: World) -> tuple[str, dict]:
    return f"/v1/models/uploads/{world.ids['upload']}/complete", world.completion


def batch_of_a(world: World) -> tuple[str, dict]:
    return "/v1/batches", {"input_file_id": world.ids["file"], "endpoint": "/v1/chat/completions",
                           "completion_window": "24h"}


CHAT = {"model": "iso-dep", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
RESPONSE = {"model": "iso-dep", "input": "Hi", "max_output_tokens": 1}

ROUTES: dict[tuple[str, str], Case] = {
    ("GET", "/healthz"): Case("public", fixed("/healthz")),
    ("GET", "/readyz"): Case("public", fixed("/readyz")),
    ("GET", "/openapi.json"): Case("public", fixed("/openapi.json")),
    ("GET", "/metrics"): Case("metrics", fixed("/metrics")),
    # admin: the operator's API
    ("POST", "/v1/tenants"): Case("admin", unique_tenant, own=403, other=403, admin=201),
    ("GET", "/v1/tenants"): Case("admin", fixed("/v1/tenants"), own=403, other=403, admin=200),
    ("POST", "/v1/tenants/{tenant}/keys"): Case(
        "admin", fixed("/v1/tenants/iso-a/keys", {"scopes": ["invoke"]}), 403, 403, 201),
    ("GET", "/v1/tenants/{tenant}/keys"): Case(
        "admin", fixed("/v1/tenants/iso-a/keys"), 403, 403, 200),
    ("GET", "/v1/tenants/{tenant}/quota"): Case(
        "admin", fixed("/v1/tenants/iso-a/quota"), 403, 403, 200),
    ("PATCH", "/v1/tenants/{tenant}/quota"): Case(
        "admin", fixed("/v1/tenants/iso-a/quota", {"max_deployments": 20}), 403, 403, 200),
    ("POST", "/v1/model-sources"): Case("admin", unique_grant, 403, 403, 201),
    ("GET", "/v1/model-sources"): Case("admin", fixed("/v1/model-sources"), 403, 403, 200),
    ("DELETE", "/v1/model-sources/{id}"): Case(
        "admin", path_with("/v1/model-sources/{}", "doomed_grant"), 403, 403, 204),
    ("POST", "/v1/price-book"): Case("admin", unique_price, 403, 403, 201),
    ("GET", "/v1/price-book"): Case("admin", fixed("/v1/price-book"), 403, 403, 200),
    ("DELETE", "/v1/price-book/{id}"): Case(
        "admin", path_with("/v1/price-book/{}", "doomed_price"), 403, 403, 204),
    ("POST", "/v1/gpu-costs"): Case("admin", unique_gpu_cost, 403, 403, 201),
    ("GET", "/v1/gpu-costs"): Case("admin", fixed("/v1/gpu-costs"), 403, 403, 200),
    ("DELETE", "/v1/gpu-costs/{id}"): Case(
        "admin", path_with("/v1/gpu-costs/{}", "doomed_cost"), 403, 403, 204),
    # deploy scope: A's deployments, sources, uploads, quota
    ("POST", "/v1/deployments"): Case("deploy", unique_deployment, own=201, other=403,
                                      admin=403),       # A's prefix is A's alone
    ("GET", "/v1/deployments"): Case("deploy", fixed("/v1/deployments"), 200, 200, 200),
    ("GET", "/v1/deployments/{name}"): Case("deploy", fixed("/v1/deployments/iso-dep")),
    ("PATCH", "/v1/deployments/{name}"): Case(
        "deploy", fixed("/v1/deployments/iso-dep", {"scaling": {"max_replicas": 2}})),
    ("DELETE", "/v1/deployments/{name}"): Case("deploy", fixed("/v1/deployments/iso-del"),
                                               own=204),
    ("POST", "/v1/deployments/{name}/traffic"): Case(
        "deploy", fixed("/v1/deployments/iso-dep/traffic", {"r1": 50, "r2": 50})),
    ("POST", "/v1/deployments/{name}/rollback"): Case(
        "deploy", fixed("/v1/deployments/iso-rb/rollback")),
    # A's adapters: B's own attach names A's base, which is not shared (404)
    ("POST", "/v1/adapters"): Case("deploy", unique_adapter, own=201),
    ("GET", "/v1/adapters"): Case("deploy", fixed("/v1/adapters"), 200, 200, 200),
    ("GET", "/v1/adapters/{name}"): Case("deploy", fixed("/v1/adapters/iso-ad")),
    ("DELETE", "/v1/adapters/{name}"): Case("deploy", fixed("/v1/adapters/iso-ad-del")),
    ("PATCH", "/v1/tenants/{tenant}/deployments/{name}"): Case(      # the operator shares a base
        "admin", fixed("/v1/tenants/iso-a/deployments/iso-lora", {"shared": False}), 403, 403, 200),
    ("GET", "/v1/models/sources"): Case("deploy", fixed("/v1/models/sources"), 200, 200, 200),
    ("GET", "/v1/quota"): Case("deploy", fixed("/v1/quota"), 200, 200, 200),
    ("GET", "/v1/keys"): Case("deploy", fixed("/v1/keys"), 200, 200, 200),
    ("DELETE", "/v1/keys/{prefix}"): Case(            # a tenant revokes its own keys only
        "deploy", path_with("/v1/keys/{}", "doomed_key"), own=200, other=404, admin=200),
    ("POST", "/v1/models/uploads"): Case("deploy", unique_upload, 201, 201, 201),
    ("GET", "/v1/models/uploads"): Case("deploy", fixed("/v1/models/uploads"), 200, 200, 200),
    ("GET", "/v1/models/uploads/{id}"): Case("deploy", path_with("/v1/models/uploads/{}",
                                                                 "upload")),
    ("POST", "/v1/models/uploads/{id}/complete"): Case("deploy", completion),
    ("DELETE", "/v1/models/uploads/{id}"): Case(
        "deploy", path_with("/v1/models/uploads/{}", "doomed_upload"), own=204),
    # invoke scope
    ("POST", "/v1/completions"): Case("invoke", fixed("/v1/completions", {
        "model": "iso-dep", "prompt": "Hi", "max_tokens": 1})),
    ("POST", "/v1/chat/completions"): Case("invoke", fixed("/v1/chat/completions", CHAT)),
    # A's stored responses: another tenant's id reads as an unknown one (404)
    ("POST", "/v1/responses"): Case("invoke", fixed("/v1/responses", RESPONSE)),
    ("GET", "/v1/responses/{response_id}"): Case("invoke", path_with("/v1/responses/{}", "response")),
    ("DELETE", "/v1/responses/{response_id}"): Case(
        "invoke", path_with("/v1/responses/{}", "doomed_response")),
    # A's batch files and batches: another tenant's id reads as an unknown one (404); an
    # upload is multipart, so this JSON body is a 400 for anyone allowed to try
    ("POST", "/v1/files"): Case("invoke", fixed("/v1/files", {"purpose": "batch"}), 400, 400, 400),
    ("GET", "/v1/files"): Case("invoke", fixed("/v1/files"), 200, 200, 200),    # each its own
    ("GET", "/v1/files/{id}"): Case("invoke", path_with("/v1/files/{}", "file")),
    ("GET", "/v1/files/{id}/content"): Case("invoke", path_with("/v1/files/{}/content", "file")),
    ("DELETE", "/v1/files/{id}"): Case("invoke", path_with("/v1/files/{}", "doomed_file")),
    ("POST", "/v1/batches"): Case("invoke", batch_of_a),
    ("GET", "/v1/batches"): Case("invoke", fixed("/v1/batches"), 200, 200, 200),  # each its own
    ("GET", "/v1/batches/{id}"): Case("invoke", path_with("/v1/batches/{}", "batch")),
    # A's batch has completed: cancelling it is a 409, and nobody else finds it
    ("POST", "/v1/batches/{id}/cancel"): Case(
        "invoke", path_with("/v1/batches/{}/cancel", "batch"), own=409),
    # A's deployment generates: embeddings from it are a 400, nobody else's at all (404)
    ("POST", "/v1/embeddings"): Case("invoke", fixed("/v1/embeddings", {
        "model": "iso-dep", "input": "Hi"}), own=400),
    ("GET", "/v1/models"): Case("invoke", fixed("/v1/models"), 200, 200, 200),   # each its own
    # A's model is no function (400 wrong_kind), and nobody else's at all (404)
    ("POST", "/v1/functions/{name}/invoke"): Case(
        "invoke", fixed("/v1/functions/iso-dep/invoke", {"input": {}}), own=400),
    ("GET", "/v1/functions/calls/{id}"): Case(
        "invoke", fixed("/v1/functions/calls/call-0"), own=404),
    ("GET", "/v1/console/deployments/{name}/activity"): Case(
        "deploy", fixed("/v1/console/deployments/iso-dep/activity")),
    # billing:read scope: each caller's own bill and prices
    ("GET", "/v1/console/usage"): Case("billing:read", fixed("/v1/console/usage"), 200, 200, 200),
    ("GET", "/v1/billing/report"): Case("billing:read", fixed("/v1/billing/report"),
                                        200, 200, 200),
    ("GET", "/v1/billing/prices"): Case("billing:read", fixed("/v1/billing/prices"),
                                        200, 200, 200),
    # webhooks: each tenant its own endpoints; the operator sees and manages every one
    ("POST", "/v1/webhooks"): Case("deploy", unique_webhook, 201, 201, 201),
    ("GET", "/v1/webhooks"): Case("deploy", fixed("/v1/webhooks"), 200, 200, 200),
    ("GET", "/v1/webhooks/{id}"): Case("deploy", path_with("/v1/webhooks/{}", "webhook"),
                                       admin=200),
    ("PATCH", "/v1/webhooks/{id}"): Case("deploy", lambda world: (
        f"/v1/webhooks/{world.ids['webhook']}", {"description": "iso"}), admin=200),
    ("DELETE", "/v1/webhooks/{id}"): Case("deploy", next_doomed_webhook, own=204, admin=204),
    ("GET", "/v1/webhooks/{id}/deliveries"): Case(
        "deploy", path_with("/v1/webhooks/{}/deliveries", "webhook"), admin=200),
    ("POST", "/v1/webhooks/{id}/test"): Case(
        "deploy", path_with("/v1/webhooks/{}/test", "webhook"), own=202, admin=202),
    # the platform's costs and margins: the operator's alone
    ("GET", "/v1/billing/margin"): Case("admin", fixed("/v1/billing/margin"), 403, 403, 200),
    # budgets: each tenant reads its own (the admin every tenant's) and sets them on its own
    # deployments and keys; the admin names the tenant (none named: 422)
    ("GET", "/v1/budgets"): Case("billing:read", fixed("/v1/budgets"), 200, 200, 200),
    ("PUT", "/v1/budgets"): Case("deploy", fixed("/v1/budgets", {
        "scope": "deployment", "deployment": "iso-dep", "limit": "1000"}), own=200, admin=422),
    ("GET", "/v1/budgets/{id}"): Case("billing:read", path_with("/v1/budgets/{}", "budget"), admin=200),
    ("DELETE", "/v1/budgets/{id}"): Case("deploy", doomed_budget, own=204, admin=204),
}


def expected(case: Case, cell: str) -> int:
    if case.access == "public":
        return 200
    if case.access == "metrics" or cell in ("anonymous", "revoked", "expired"):
        return 401
    if cell == "wrong_scope":
        return 403
    return {"own": case.own, "other": case.other, "admin": case.admin}[cell]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory, runtime_replica):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-matrix"))
    async with running_control_plane(settings, base_urls=[runtime_replica.base_url]) as plane:
        yield plane


async def make_keys(plane, world: World) -> None:
    admin = plane.admin
    world.keys["own"] = await plane.tenant_key("iso-a")
    world.keys["other"] = await plane.tenant_key("iso-b")
    world.keys["admin"] = plane.admin_key
    for scope in TENANT_SCOPES:
        world.wrong[scope] = await plane.tenant_key(
            "iso-a", scopes=[s for s in TENANT_SCOPES if s != scope])
    revoked = (await admin.post("/v1/tenants/iso-a/keys",
                                json={"scopes": list(TENANT_SCOPES)})).json()
    assert (await admin.delete(f"/v1/keys/{revoked['prefix']}")).status_code == 200
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()
    expired = (await admin.post("/v1/tenants/iso-a/keys", json={
        "scopes": list(TENANT_SCOPES), "expires_at": past})).json()
    doomed = (await admin.post("/v1/tenants/iso-a/keys", json={"scopes": ["invoke"]})).json()
    world.keys.update(revoked=revoked["key"], expired=expired["key"], anonymous="")
    world.ids["doomed_key"] = doomed["prefix"]
    world.markers |= {revoked["prefix"], expired["prefix"], doomed["prefix"]}


async def make_deployments(plane, world: World) -> None:
    a = plane.client(world.keys["own"])
    for name in ("iso-dep", "iso-rb", "iso-del"):
        created = await a.post("/v1/deployments", json={"name": name,
                                                        "model_uri": world.ids["model"]})
        assert created.status_code == 201, created.text
        world.markers.add(created.json()["id"])
    for name, promote in (("iso-dep", False), ("iso-rb", True)):
        second = await a.patch(f"/v1/deployments/{name}", json={"engine": {"seed": 1},
                                                               "promote": promote})
        world.markers |= {r["id"] for r in second.json()["revisions"]}
    await plane.set_price(tenant="iso-a", input_per_mtok=A_PRICE, output_per_mtok=A_PRICE)
    served = await a.post("/v1/chat/completions", json=CHAT)      # A's bill is not empty
    assert served.status_code == 200, served.text
    for name in ("response", "doomed_response"):
        stored = await a.post("/v1/responses", json=RESPONSE)
        assert stored.status_code == 200, stored.text
        world.ids[name] = stored.json()["id"]
    await make_batch(a, world)
    await plane.flush_usage()


async def make_batch(a: httpx.AsyncClient, world: World) -> None:
    """Two files of A's (one to delete) and a batch of one line, run to its end."""
    line = json.dumps({"custom_id": "iso-1", "method": "POST", "url": "/v1/chat/completions", "body": CHAT})
    for name in ("file", "doomed_file"):
        made = await a.post("/v1/files", data={"purpose": "batch"},
                            files={"file": ("iso.jsonl", line.encode() + b"\n", "application/jsonl")})
        assert made.status_code == 200, made.text
        world.ids[name] = made.json()["id"]
    batch = await a.post("/v1/batches", json=batch_of_a(world)[1])
    assert batch.status_code == 200, batch.text
    world.ids["batch"] = batch.json()["id"]

    async def ended():
        got = (await a.get(f"/v1/batches/{world.ids['batch']}")).json()
        return got if got["status"] in ("completed", "failed") else None
    done = await eventually(ended, timeout_s=120, what="A's batch at its end")
    world.markers |= {world.ids["file"], world.ids["doomed_file"], world.ids["batch"],
                      done["output_file_id"]}


async def make_adapters(plane, world: World) -> None:
    """A base with adapter slots and two adapters of A's, one to delete."""
    a = plane.client(world.keys["own"])
    base = await a.post("/v1/deployments", json={"name": "iso-lora", "model_uri": world.ids["model"],
                                                 "engine": {"max_loras": 2}})
    assert base.status_code == 201, base.text
    world.markers.add(base.json()["id"])
    for name in ("iso-ad", "iso-ad-del"):
        made = await a.post("/v1/adapters", json={"name": name, "base": "iso-lora",
                                                  "adapter_uri": world.ids["adapter"]})
        assert made.status_code == 201, made.text
        world.markers.add(made.json()["id"])


async def make_budgets(plane, world: World) -> None:
    """A's budget on iso-dep (set again by the matrix: 200), and one on each of A's keys
    for the cells that delete one."""
    a = plane.client(world.keys["own"])
    made = await a.put("/v1/budgets", json={"scope": "deployment", "deployment": "iso-dep", "limit": "1000"})
    assert made.status_code == 201, made.text
    world.ids["budget"] = made.json()["id"]
    for key in (await a.get("/v1/keys")).json()["data"]:
        doomed = await a.put("/v1/budgets", json={"scope": "key", "key": key["id"], "limit": "1000"})
        assert doomed.status_code == 201, doomed.text
        world.doomed_budgets.append(doomed.json()["id"])
    world.markers |= {world.ids["budget"], *world.doomed_budgets}


async def make_sources_prices_uploads(plane, world: World) -> None:
    world.ids["doomed_grant"] = (await plane.grant("s3://cp-models/iso-doomed/"))["id"]
    later = (datetime.now(timezone.utc) + timedelta(days=60)).isoformat()
    world.ids["doomed_price"] = (await plane.set_price(
        tenant="iso-a", input_per_mtok="9", output_per_mtok="9", effective_from=later))["id"]
    doomed_cost = await plane.admin.post("/v1/gpu-costs", json={
        "gpu_kind": "cpu", "per_gpu_second": "0.001", "effective_from": later})
    assert doomed_cost.status_code == 201, doomed_cost.text
    world.ids["doomed_cost"] = doomed_cost.json()["id"]
    a = plane.client(world.keys["own"])
    urls = {}
    for name in ("upload", "doomed_upload"):
        started = await a.post("/v1/models/uploads", json={
            "name": f"iso-{name}", "files": [{"path": "a.bin", "size": 10}]})
        assert started.status_code == 201, started.text
        world.ids[name] = started.json()["id"]
        urls[name] = started.json()["files"][0]["parts"][0]["url"]
    async with httpx.AsyncClient() as s3:          # A's client PUTs its one part
        etag = (await s3.put(urls["upload"], content=b"0123456789")).headers["etag"]
    world.completion = {"files": [{"path": "a.bin", "parts": [{"part_number": 1,
                                                                "etag": etag}]}]}


async def make_webhooks(plane, world: World) -> None:
    """A's endpoint (its URL a marker), and one more of A's for each cell to delete."""
    a = plane.client(world.keys["own"])
    for n in range(len(CELLS) + 1):
        made = await a.post("/v1/webhooks", json={"url": f"http://127.0.0.1:9/iso-a-hook-{n}",
                                                  "event_types": ["budget.threshold"]})
        assert made.status_code == 201, made.text
        world.markers |= {made.json()["id"], made.json()["url"], made.json()["secret"]}
        world.doomed_webhooks.append(made.json()["id"])
    world.ids["webhook"] = world.doomed_webhooks.pop(0)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(plane, tiny_model, s3_server, models_bucket, tmp_path_factory):
    world = World()
    world.ids["model"] = upload_model(tiny_model, s3_server.client(), models_bucket,
                                      "iso-a/model")
    await make_keys(plane, world)
    await make_deployments(plane, world)
    world.ids["adapter"] = upload_model(make_adapter(tiny_model, tmp_path_factory.mktemp("iso-adapter"), 4,
                                                     ["q_proj", "v_proj"], seed=0),
                                        s3_server.client(), models_bucket, "iso-a/adapter")
    await make_adapters(plane, world)
    await make_sources_prices_uploads(plane, world)
    await make_budgets(plane, world)
    await make_webhooks(plane, world)
    async with plane.app.state.sessions() as session:
        from controlplane.store.tenants import find_tenant

        world.markers |= {(await find_tenant(session, "iso-a")).id, "iso-a", A_PRICE,
                          world.ids["model"]}
    return world


def key_for(world: World, case: Case, cell: str) -> str:
    if cell != "wrong_scope":
        return world.keys[cell]
    return world.wrong.get(case.access, world.keys["own"])     # admin routes: A's full key


async def test_every_route_is_in_the_matrix(plane):
    assert set(every_route(plane.app.routes)) == set(ROUTES), \
        "a route was added or removed: give it its row in ROUTES"


async def test_the_isolation_matrix(plane, world):
    failures = []
    for (method, _), case in ROUTES.items():
        for cell in CELLS:
            path, body = case.request(world)
            key = key_for(world, case, cell)
            client = plane.client(key or None)
            response = await client.request(method, path, json=body)
            failures += check_cell(world, case, cell, method, path, body, response)
    assert not failures, "\n".join(failures)


def check_cell(world: World, case: Case, cell: str, method: str, path: str,
               body: Optional[dict], response: httpx.Response) -> list[str]:
    where = f"{method} {path} as {cell}"
    problems = []
    if response.status_code != expected(case, cell):
        problems.append(f"{where}: {response.status_code} (expected {expected(case, cell)}): "
                        f"{response.text[:200]}")
    if 400 <= response.status_code < 500:
        error = response.json().get("error", {})
        if set(error) != {"message", "type", "param", "code"}:
            problems.append(f"{where}: not the error shape: {response.text[:200]}")
    if cell not in ("own", "admin", "wrong_scope"):
        sent = path + str(body)
        leaked = [m for m in world.markers if m in response.text and m not in sent]
        if leaked:
            problems.append(f"{where}: shows A's {leaked}")
    return problems
