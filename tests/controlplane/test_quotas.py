"""Quotas: the static checks as pure functions, then over HTTP on real Postgres and S3
(422 naming the limit; admin overrides; the tenant's own view). GPUs held at once and
queued requests are enforced by the pool (tests/pool), which gets them in RevisionSpec.quota."""
import pytest
import pytest_asyncio

from controlplane.quotas import DeploymentShape, Quota, TenantHoldings, check_deployment, check_upload
from controlplane.store.errors import StaticQuotaExceeded
from tests.controlplane.conftest import make_settings, running_control_plane

QUOTA = Quota(max_gpus=4, max_replicas_per_deployment=3, max_deployments=2,
              max_upload_bytes=100)
NOTHING = TenantHoldings(deployments=0, reserved_gpus=0)


@pytest.mark.parametrize("shape, others, limit", [
    (DeploymentShape(0, 3, (1,)), TenantHoldings(2, 0), "max_deployments"),
    (DeploymentShape(0, 4, (1,)), NOTHING, "max_replicas_per_deployment"),
    (DeploymentShape(0, 3, (2,)), NOTHING, "max_gpus"),          # 2 GPUs x 3 replicas
    (DeploymentShape(2, 2, (1,)), TenantHoldings(1, 3), "max_gpus"),   # 3 held + 2 kept
    (DeploymentShape(1, 1, (2, 2)), TenantHoldings(1, 1), "max_gpus"),  # a canary keeps both
])
def test_a_new_deployment_past_a_limit_names_it(shape, others, limit):
    with pytest.raises(StaticQuotaExceeded) as refused:
        check_deployment(QUOTA, shape, others, before=None)
    assert refused.value.limit == limit and str(refused.value).startswith(limit + ": ")


def test_within_every_limit_passes_and_none_is_no_limit():
    check_deployment(QUOTA, DeploymentShape(2, 2, (2,)), TenantHoldings(1, 0), before=None)
    check_deployment(Quota(), DeploymentShape(100, 1000, (8, 8)), TenantHoldings(10**6, 10**6),
                     before=None)


def test_a_tenant_over_a_lowered_quota_may_shrink_but_not_grow():
    held = DeploymentShape(0, 6, (1,))           # from before the admin lowered the limit to 3
    check_deployment(QUOTA, DeploymentShape(0, 5, (1,)), NOTHING, before=held)
    check_deployment(QUOTA, DeploymentShape(0, 6, (1,)), NOTHING, before=held)
    with pytest.raises(StaticQuotaExceeded, match="^max_replicas_per_deployment"):
        check_deployment(QUOTA, DeploymentShape(0, 7, (1,)), NOTHING, before=held)


def test_uploads_count_what_is_held_already():
    check_upload(QUOTA, used_bytes=60, adding_bytes=40)
    with pytest.raises(StaticQuotaExceeded, match="^max_upload_bytes"):
        check_upload(QUOTA, used_bytes=60, adding_bytes=41)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-quota"),
                             quota_max_gpus=4, quota_max_replicas_per_deployment=4,
                             quota_max_deployments=2)
    async with running_control_plane(settings) as plane:
        yield plane


def deploy(name, model_uri, gpus=1, max_replicas=1, min_replicas=0):
    return {"name": name, "model_uri": model_uri, "resources": {"gpu_count": gpus},
            "scaling": {"min_replicas": min_replicas, "max_replicas": max_replicas}}


def refused_by(response, limit):
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("quota_exceeded", limit), error
    assert error["message"].startswith(limit + ": ")
    return True


in_session_loop = pytest.mark.asyncio(loop_scope="session")


@in_session_loop
async def test_static_limits_are_422_naming_the_limit(plane, model_uri):
    client = plane.client(await plane.tenant_key("limited"))
    pool = plane.app.state.pool
    read_before = len(pool.inspected)
    assert refused_by(await client.post("/v1/deployments", json=deploy(
        "wide", model_uri, max_replicas=5)), "max_replicas_per_deployment")
    assert refused_by(await client.post("/v1/deployments", json=deploy(
        "wide", model_uri, gpus=2, max_replicas=3)), "max_gpus")
    assert len(pool.inspected) == read_before, "a refused deploy reads no model"
    assert (await client.post("/v1/deployments", json=deploy(
        "one", model_uri, max_replicas=4, min_replicas=3))).status_code == 201
    assert refused_by(await client.post("/v1/deployments", json=deploy(
        "two", model_uri, min_replicas=2, max_replicas=2)), "max_gpus")   # 3 + 2 kept held
    assert (await client.post("/v1/deployments", json=deploy("two", model_uri))).status_code == 201
    assert refused_by(await client.post("/v1/deployments", json=deploy(
        "three", model_uri)), "max_deployments")
    assert refused_by(await client.patch("/v1/deployments/two", json={
        "scaling": {"max_replicas": 5}}), "max_replicas_per_deployment")
    assert refused_by(await client.patch("/v1/deployments/one", json={
        "resources": {"gpu_count": 2}}), "max_gpus")
    view = (await client.get("/v1/quota")).json()
    assert view["limits"]["max_deployments"] == 2 and "overrides" not in view
    assert view["usage"] == {"deployments": 2, "reserved_gpus": 3, "upload_bytes": 0}


@in_session_loop
async def test_admin_overrides_and_a_lowered_quota_lets_a_tenant_shrink(plane, model_uri):
    client = plane.client(await plane.tenant_key("grows"))
    admin = plane.admin
    assert (await client.post("/v1/deployments", json=deploy(
        "big", model_uri, max_replicas=4))).status_code == 201
    raised = await admin.patch("/v1/tenants/grows/quota", json={"max_replicas_per_deployment": 8,
                                                                "max_gpus": 8})
    assert raised.status_code == 200, raised.text
    assert raised.json()["overrides"]["max_gpus"] == 8
    assert raised.json()["limits"]["max_deployments"] == 2, "the rest stays the default"
    assert (await client.patch("/v1/deployments/big", json={
        "scaling": {"max_replicas": 8}})).status_code == 200
    lowered = await admin.patch("/v1/tenants/grows/quota", json={
        "max_replicas_per_deployment": 2, "max_gpus": None})
    assert lowered.json()["limits"]["max_gpus"] == 4, "null: back to the default"
    assert (await client.patch("/v1/deployments/big", json={
        "scaling": {"max_replicas": 6}})).status_code == 200, "shrinking is always allowed"
    assert refused_by(await client.patch("/v1/deployments/big", json={
        "scaling": {"max_replicas": 7}}), "max_replicas_per_deployment")
    bad = await admin.patch("/v1/tenants/grows/quota", json={"max_gpus": -1})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "max_gpus"
    assert (await admin.get("/v1/tenants/nobody/quota")).status_code == 404
    assert (await client.patch("/v1/tenants/grows/quota", json={"max_gpus": 99})).status_code == 403


@in_session_loop
async def test_an_egress_grant_is_the_admins_and_travels_to_the_pool(plane, model_uri):
    from controlplane.store.desired_state import PostgresDesiredState

    client = plane.client(await plane.tenant_key("reaches"))
    assert (await client.get("/v1/quota")).json()["limits"]["egress"] is None, "none by default"
    granted = await plane.admin.patch("/v1/tenants/reaches/quota", json={
        "egress": ["API.example.com:443", "10.0.0.5:8080", "api.example.com:443"]})
    assert granted.status_code == 200, granted.text
    hosts = ["10.0.0.5:8080", "api.example.com:443"]
    assert granted.json()["limits"]["egress"] == hosts
    assert (await client.get("/v1/quota")).json()["limits"]["egress"] == hosts, "its tenant sees its grant"
    for bad in (["api.example.com"], ["a b:1"], ["x:99999"], [1], "api.example.com:443", ["h:1"] * 33):
        refused = await plane.admin.patch("/v1/tenants/reaches/quota", json={"egress": bad})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "egress", (bad, refused.text)
    assert (await client.patch("/v1/tenants/reaches/quota", json={"egress": ["evil.example:443"]})).status_code == 403
    made = await client.post("/v1/deployments", json=deploy("out", model_uri))
    assert made.status_code == 201, made.text
    desired = PostgresDesiredState(plane.app.state.sessions, plane.app.state.settings.default_quota,
                                   plane.app.state.sealer)
    (spec,) = [s for s in await desired.revisions() if s.deployment_id == made.json()["id"]]
    assert spec.quota.egress == tuple(hosts), "the pool's sandbox opens these for its function servers"
    cleared = await plane.admin.patch("/v1/tenants/reaches/quota", json={"egress": None})
    assert cleared.json()["limits"]["egress"] is None
