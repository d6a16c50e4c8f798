"""Model sources: a tenant deploys only from its own prefix and what an admin granted it,
refused (403, one message) before any S3 request; on real Postgres and S3."""
import uuid

import pytest
import pytest_asyncio
from cryptography.exceptions import InvalidTag
from sqlalchemy import select

from controlplane.deploy.model_sources import check_grantable, check_source, own_prefix, parse_s3_uri
from controlplane.store.tables import ModelSource
from controlplane.store import tenants
from controlplane.store.desired_state import PostgresDesiredState
from controlplane.store.errors import Forbidden, InvalidField
from pool.api import S3Access
from tests.controlplane.conftest import (CATALOGUE, legacy_prefix, make_settings,
                                         running_control_plane)
from tests.support.model_factory import upload_model

in_session_loop = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.parametrize("uri", ["s3://b/a/../b/", "s3://b/a//b/", "s3://b/./a/", "s3://b/",
                                 "s3://B/a/", "s3://b/a b/", "s3://b/a\x00/", "/models/a",
                                 "s3://b/a\\b/"])
def test_uris_that_could_name_another_prefix_are_refused(uri):
    with pytest.raises(InvalidField):
        parse_s3_uri("model_uri", uri)


def test_prefixes_match_whole_segments():
    mine = [own_prefix("models", "acme")]
    assert mine == ["s3://models/tenants/acme/"]
    check_source("model_uri", parse_s3_uri("model_uri", "s3://models/tenants/acme/chat"), mine)
    for other in ("s3://models/tenants/acme-2/chat/", "s3://models/tenants/acm/",
                  "s3://other/tenants/acme/chat/", "s3://models/acme/chat/"):
        with pytest.raises(Forbidden):
            check_source("model_uri", parse_s3_uri("model_uri", other), mine)
    assert parse_s3_uri("prefix", "s3://models/", bucket_root=True) == "s3://models/"


@pytest.mark.parametrize("prefix", ["s3://models/", "s3://models/tenants/",
                                    "s3://models/tenants/0b7c5e0e-9f1a-4d43-9d0e-1c2b3a4d5e6f/",
                                    "s3://models/tenants/x/chat/"])
def test_no_grant_reaches_into_the_tenants_namespace(prefix):
    with pytest.raises(InvalidField) as refused:
        check_grantable(parse_s3_uri("prefix", prefix, bucket_root=True), "models")
    assert refused.value.field == "prefix"
    for fine in ("s3://models/tenants-old/", "s3://models/catalogue/tenants/", "s3://other/",
                 "s3://other/tenants/"):
        check_grantable(parse_s3_uri("prefix", fine, bucket_root=True), "models")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-sources"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest.fixture(scope="module")
def models(tiny_model, s3_server, models_bucket):
    """B's private model, A's own model and A's own draft model, in the real S3."""
    s3 = s3_server.client()
    return {name: upload_model(tiny_model, s3, models_bucket, prefix) for name, prefix in
            [("b", "src-b/private"), ("a", "src-a/mine"), ("a_draft", "src-a/draft")]}


def deploy(name, model_uri, **extra):
    return {"name": name, "model_uri": model_uri, **extra}


def denied(response, field="model_uri"):
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_source_denied", field), error
    return error["message"]


def read_under(pool, prefix: str, since: tuple[int, int] = (0, 0)) -> list:
    """The pool's S3 requests and model inspections under `prefix`, after `since`
    (a `mark(pool)`)."""
    return [r for r in pool.s3_requests[since[0]:] if r[1].startswith(prefix)] + \
        [uri for uri in pool.inspected[since[1]:] if uri.startswith(prefix)]


def mark(pool) -> tuple[int, int]:
    return len(pool.s3_requests), len(pool.inspected)


@in_session_loop
async def test_another_tenants_prefix_is_403_alike_existing_or_not_and_never_read(
        plane, models, models_bucket):
    a = plane.client(await plane.tenant_key("src-a"))
    await plane.tenant_key("src-b")
    pool = plane.app.state.pool
    since = mark(pool)
    existing = denied(await a.post("/v1/deployments", json=deploy("stolen", models["b"])))
    missing = denied(await a.post("/v1/deployments", json=deploy(
        "stolen", f"s3://{models_bucket}/src-b/no-such-model/")))
    assert existing == missing, "the answer says nothing of what exists"
    assert "src-b" not in existing
    assert denied(await a.post("/v1/deployments", json=deploy(
        "stolen", f"s3://{models_bucket}/src-ab/x/")))
    own = await a.post("/v1/deployments", json=deploy("mine", models["a"]))
    assert own.status_code == 201, own.text
    denied(await a.patch("/v1/deployments/mine", json={"model_uri": models["b"]}))
    traversal = await a.post("/v1/deployments", json=deploy(
        "stolen", f"s3://{models_bucket}/src-a/../src-b/private/"))
    assert traversal.status_code == 422 and traversal.json()["error"]["param"] == "model_uri"
    assert read_under(pool, f"s3://{models_bucket}/src-b/", since) == [], \
        "no S3 request for B's objects"
    assert read_under(pool, models["a"], since), "the control: A's own model was read"


@in_session_loop
async def test_a_grant_lets_a_tenant_deploy_and_a_revoke_stops_new_revisions(plane, models):
    a = plane.client(await plane.tenant_key("src-a"))
    c = plane.client(await plane.tenant_key("src-c"))
    grant = await plane.grant(models["b"], tenant="src-a")
    assert grant["tenant"] == "src-a" and grant["prefix"] == models["b"]
    sources = (await a.get("/v1/models/sources")).json()["data"]
    assert {(s["prefix"], s["kind"]) for s in sources} == {
        (own_prefix("cp-models", await tenant_id(plane, "src-a")), "own"), (CATALOGUE, "shared"),
        (legacy_prefix("src-a"), "granted"), (models["b"], "granted")}
    c_sources = (await c.get("/v1/models/sources")).json()["data"]
    assert models["b"] not in [s["prefix"] for s in c_sources], "a grant to A is A's alone"
    denied(await c.post("/v1/deployments", json=deploy("borrowed", models["b"])))
    borrowed = await a.post("/v1/deployments", json=deploy("borrowed", models["b"]))
    assert borrowed.status_code == 201, borrowed.text
    listed = (await plane.admin.get("/v1/model-sources", params={"tenant": "src-a"})).json()
    assert grant["id"] in [g["id"] for g in listed["data"]]
    assert (await plane.admin.post("/v1/model-sources", json={
        "prefix": models["b"], "tenant": "src-a"})).status_code == 409

    assert (await plane.admin.delete(f"/v1/model-sources/{grant['id']}")).status_code == 204
    denied(await a.patch("/v1/deployments/borrowed", json={"engine": {"seed": 1}}))
    denied(await a.post("/v1/deployments", json=deploy("again", models["b"])))
    scaled = await a.patch("/v1/deployments/borrowed", json={"scaling": {"max_replicas": 2}})
    assert scaled.status_code == 200, "no new revision, no new read: scaling still works"
    assert (await plane.admin.delete(f"/v1/model-sources/{grant['id']}")).status_code == 404
    assert (await a.post("/v1/model-sources", json={"prefix": models["b"]})).status_code == 403


async def tenant_id(plane, name: str) -> str:
    listed = (await plane.admin.get("/v1/tenants")).json()["data"]
    return next(t["id"] for t in listed if t["name"] == name)


@in_session_loop
async def test_grants_into_the_tenants_namespace_are_refused_and_names_reach_nothing(
        plane, models, models_bucket):
    """A tenant named like a granted prefix gets nothing of it; no grant, shared or to one
    tenant, can reach another tenant's uploads (or every tenant's, from the bucket's root)."""
    await plane.tenant_key("src-a")
    await plane.tenant_key("src-b")
    victim = await tenant_id(plane, "src-b")
    for prefix in (f"s3://{models_bucket}/", f"s3://{models_bucket}/tenants/",
                   own_prefix(models_bucket, victim), f"{own_prefix(models_bucket, victim)}x/"):
        for tenant in (None, "src-a"):
            refused = await plane.admin.post("/v1/model-sources",
                                             json={"prefix": prefix, "tenant": tenant})
            assert refused.status_code == 422, (prefix, refused.text)
            assert refused.json()["error"]["param"] == "prefix"
    shared = await plane.admin.post("/v1/tenants", json={"name": "tiny"})   # CATALOGUE's name
    assert shared.status_code in (201, 409), shared.text
    key = await plane.admin.post("/v1/tenants/tiny/keys", json={"scopes": ["deploy"]})
    sources = (await plane.client(key.json()["key"]).get("/v1/models/sources")).json()["data"]
    assert {(s["prefix"], s["kind"]) for s in sources} == {
        (own_prefix(models_bucket, await tenant_id(plane, "tiny")), "own"), (CATALOGUE, "shared")}


@in_session_loop
async def test_a_draft_model_is_a_model_uri_under_the_same_rules(plane, models, models_bucket):
    a = plane.client(await plane.tenant_key("src-a"))
    pool = plane.app.state.pool
    since = mark(pool)

    def draft(model):
        return {"engine": {"speculative": {"method": "draft", "model": model, "k": 2}}}

    for path in ("/models/draft", "draft", "file:///models/draft"):
        refused = await a.post("/v1/deployments", json=deploy("spec", models["a"], **draft(path)))
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["param"] == "engine.speculative.model"
    denied(await a.post("/v1/deployments", json=deploy("spec", models["a"], **draft(models["b"]))),
           field="engine.speculative.model")
    assert read_under(pool, f"s3://{models_bucket}/src-b/", since) == []
    created = await a.post("/v1/deployments", json=deploy("spec", models["a"],
                                                          **draft(models["a_draft"])))
    assert created.status_code == 201, created.text
    engine = created.json()["revisions"][0]["engine"]
    assert engine["speculative"] == {"method": "draft", "model": models["a_draft"], "k": 2}
    assert models["a_draft"] in pool.inspected, "the draft model is checked in S3 too"
    patched = await a.patch("/v1/deployments/spec", json={"engine": {
        "speculative": {"method": "draft", "model": models["b"]}}})
    denied(patched, field="engine.speculative.model")


@in_session_loop
async def test_a_tenants_own_bucket_is_granted_with_a_sealed_secret_only_it_reads_with(plane):
    """The secret goes in once and never comes out of the API, is stored sealed (bound to
    its row), and only the granted tenant's reads of that bucket use it."""
    await plane.tenant_key("own-a"), await plane.tenant_key("own-b")
    secret = "s3cr3t-" + uuid.uuid4().hex
    given = {"access_key_id": "AKIAOWN", "secret_access_key": secret,
             "endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}
    refused = await plane.admin.post("/v1/model-sources", json={"prefix": "s3://own-a-bucket/",
                                                                "credentials": given})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "credentials", refused.text
    bad = await plane.admin.post("/v1/model-sources", json={
        "prefix": "s3://own-a-bucket/", "tenant": "own-a", "credentials": {**given, "endpoint_url": "ftp://x"}})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "credentials.endpoint_url"
    made = await plane.admin.post("/v1/model-sources", json={"prefix": "s3://own-a-bucket/",
                                                             "tenant": "own-a", "credentials": given})
    assert made.status_code == 201, made.text
    listed = await plane.admin.get("/v1/model-sources", params={"tenant": "own-a"})
    for text_out in (made.text, listed.text):
        assert secret not in text_out
    assert made.json()["credentials"] == {"access_key_id": "AKIAOWN", "endpoint_url": given["endpoint_url"],
                                          "region": "eu-west-1"}

    state = plane.app.state
    async with state.sessions() as session:
        sealed = (await session.execute(select(ModelSource.secret_sealed).where(
            ModelSource.id == made.json()["id"]))).scalar_one()
        a, b = [await tenants.find_tenant(session, name) for name in ("own-a", "own-b")]
    assert secret.encode() not in sealed
    with pytest.raises(InvalidTag):
        state.sealer.open(sealed, "another-row")

    desired = PostgresDesiredState(state.sessions, state.settings.default_quota, state.sealer)
    access = await desired.source_access(a.id, "s3://own-a-bucket/models/m/")
    assert access == S3Access("AKIAOWN", secret, endpoint_url=given["endpoint_url"], region="eu-west-1")
    assert await desired.source_access(b.id, "s3://own-a-bucket/models/m/") is None
    assert await desired.source_access(a.id, "s3://own-a-bucket-2/m/") is None, "whole segments only"
