"""Tenants, keys and auth over real HTTP against a migrated Postgres."""
import json
from datetime import datetime, timedelta, timezone

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.auth.keys import hash_key
from controlplane.store.tables import ApiKey
from tests.controlplane.conftest import METRICS_TOKEN, make_settings, running_control_plane
from tests.controlplane.support.routes import every_route, filled

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-auth"))
    async with running_control_plane(settings) as plane:
        yield plane


# The only routes anyone may call without a key. Written out here, not imported from
# controlplane.auth.middleware, so a route made public by mistake fails this file. /metrics takes the
# metrics token instead of a key.
PUBLIC_ROUTES = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json")}
METRICS = ("GET", "/metrics")


async def test_every_call_needs_a_key(plane):
    """Walks the app's route table, so a new route without auth fails here."""
    routes = [(m, filled(p)) for m, p in every_route(plane.app.routes)]
    assert {("GET", "/v1/deployments"), ("POST", "/v1/chat/completions"),
            ("GET", "/v1/billing/report"), ("POST", "/v1/tenants"),
            ("DELETE", "/v1/deployments/x1")} <= set(routes), "the walk missed known routes"
    assert PUBLIC_ROUTES | {METRICS} <= set(routes)
    anonymous, bad = plane.client(), plane.client("tp_nothere_secret")
    for method, path in routes:
        response = await anonymous.request(method, path)
        if (method, path) in PUBLIC_ROUTES:
            assert response.status_code == 200, (method, path, response.text)
            continue
        expected_code = "invalid_metrics_token" if (method, path) == METRICS else "missing_key"
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["error"]["type"] == "authentication_error", (method, path)
        assert response.json()["error"]["code"] == expected_code, (method, path)
        assert response.headers["x-request-id"]
        wrong = await bad.request(method, path)
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] in (
            "invalid_key", "invalid_metrics_token"), (method, path, wrong.text)


async def test_health_is_public_and_metrics_take_the_metrics_token(plane):
    client = plane.client()
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] is True
    assert (await client.get("/metrics")).status_code == 401
    assert (await plane.admin.get("/metrics")).status_code == 401, "an admin key is not it"
    assert (await plane.client("not-the-token").get("/metrics")).status_code == 401
    metrics = await plane.client(METRICS_TOKEN).get("/metrics")
    assert "thawpool_http_requests_total" in metrics.text
    assert "thawpool_usage_outbox_depth" in metrics.text


async def test_keys_are_shown_once_and_stored_hashed(plane):
    admin = plane.admin
    assert (await admin.post("/v1/tenants", json={"name": "acme"})).status_code == 201
    assert (await admin.post("/v1/tenants", json={"name": "acme"})).status_code == 409
    response = await admin.post("/v1/tenants/acme/keys", json={"scopes": ["invoke"]})
    assert response.status_code == 201
    body = response.json()
    secret = body["key"]
    assert secret.startswith(body["prefix"] + "_") and len(secret) > 40
    async with plane.app.state.sessions() as session:
        stored = await session.scalar(select(ApiKey).where(ApiKey.prefix == body["prefix"]))
    assert stored.key_hash == hash_key(secret) and secret not in stored.key_hash
    listing = (await admin.get("/v1/tenants/acme/keys")).json()["data"]
    assert [k["prefix"] for k in listing] == [body["prefix"]]
    assert all("key" not in k for k in listing)


async def test_scopes_are_enforced_with_403(plane):
    key = await plane.tenant_key("scoped", scopes=["invoke"])
    client = plane.client(key)
    response = await client.get("/v1/deployments")
    assert response.status_code == 403 and "deploy" in response.json()["error"]["message"]
    assert (await client.get("/v1/billing/report")).status_code == 403
    assert (await client.post("/v1/tenants", json={"name": "x"})).status_code == 403


async def test_revoked_and_expired_keys_stop_working(plane):
    admin = plane.admin
    await admin.post("/v1/tenants", json={"name": "revokes"})
    created = (await admin.post("/v1/tenants/revokes/keys",
                                json={"scopes": ["deploy"]})).json()
    client = plane.client(created["key"])
    assert (await client.get("/v1/deployments")).status_code == 200
    assert (await admin.delete(f"/v1/keys/{created['prefix']}")).status_code == 200
    assert (await client.get("/v1/deployments")).status_code == 401
    assert (await admin.delete("/v1/keys/tp_missing")).status_code == 404
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()
    expired = (await admin.post("/v1/tenants/revokes/keys",
                                json={"scopes": ["deploy"], "expires_at": past})).json()
    assert (await plane.client(expired["key"]).get("/v1/deployments")).status_code == 401


async def test_key_body_is_validated(plane):
    admin = plane.admin
    await admin.post("/v1/tenants", json={"name": "valid"})
    for body, field in [({"scopes": ["fly"]}, "scopes"), ({"scopes": ["invoke"], "x": 1}, "x"),
                        ({"requests_per_min": 0}, "requests_per_min"),
                        ({"expires_at": "soon"}, "expires_at")]:
        response = await admin.post("/v1/tenants/valid/keys", json=body)
        assert response.status_code == 422 and response.json()["error"]["param"] == field
    assert (await admin.post("/v1/tenants/nobody/keys", json={})).status_code == 404
    assert (await admin.post("/v1/tenants", json={"name": "Bad Name"})).status_code == 422


async def test_request_id_is_accepted_or_generated(plane):
    client = plane.client()
    given = await client.get("/healthz", headers={"x-request-id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    made = await client.get("/healthz", headers={"x-request-id": "bad id with spaces"})
    assert made.headers["x-request-id"] != "bad id with spaces"
    assert len(made.headers["x-request-id"]) == 32


async def test_the_admin_scope_exists_only_on_the_operators_tenant(plane):
    admin = plane.admin
    await admin.post("/v1/tenants", json={"name": "climber"})
    refused = await admin.post("/v1/tenants/climber/keys", json={"scopes": ["admin", "deploy"]})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "scopes"
    assert "operator's tenant" in refused.json()["error"]["message"]
    assert (await admin.post("/v1/tenants/system/keys",
                             json={"scopes": ["admin"]})).status_code == 201
    # a row written some other way (an old database, a hand-made key) still grants nothing
    key = await plane.tenant_key("climber", scopes=["deploy"])
    async with plane.app.state.sessions.begin() as session:
        stored = await session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
        stored.scopes = ["admin", "deploy"]
    assert (await plane.client(key).get("/v1/tenants")).status_code == 403


async def test_a_taken_key_prefix_is_retried_not_a_500(plane, monkeypatch):
    from controlplane.auth.keys import NewKey, generate_key
    from controlplane.store import tenants

    await plane.admin.post("/v1/tenants", json={"name": "collide"})
    first = (await plane.admin.post("/v1/tenants/collide/keys", json={})).json()
    clash = generate_key()          # a new secret whose visible prefix is already taken
    made = iter([NewKey(clash.secret, first["prefix"], clash.key_hash), generate_key()])
    monkeypatch.setattr(tenants, "generate_key", lambda: next(made))
    second = await plane.admin.post("/v1/tenants/collide/keys", json={})
    assert second.status_code == 201, second.text
    assert second.json()["prefix"] != first["prefix"]
    assert (await plane.client(second.json()["key"]).get("/v1/deployments")).status_code == 403


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000,
                                 b'{"a":' * 65 + b"1" + b"}" * 65])
async def test_deeply_nested_json_is_400_not_500(plane, raw):
    response = await plane.admin.post("/v1/tenants", content=raw,
                                      headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:200]
    assert response.json()["error"]["param"] == "body"


@pytest.mark.parametrize("path, body, param", [
    ("/v1/tenants/valid/keys", {"name": "nul\u0000"}, "name"),
    ("/v1/tenants/valid/keys", {"requests_per_min": 2 ** 40}, "requests_per_min"),
    ("/v1/tenants/valid/keys", {"name": "\ud800"}, "name"),
    ("/v1/model-sources", {"prefix": "s3://bucket/a/../b/"}, "prefix"),
])
async def test_values_postgres_cannot_store_are_422_not_500(plane, path, body, param):
    await plane.admin.post("/v1/tenants", json={"name": "valid"})
    response = await plane.admin.post(path, content=json.dumps(body),
                                      headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param
