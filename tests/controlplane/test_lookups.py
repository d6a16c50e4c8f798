"""The hot path's in-memory copies, kept current through Postgres LISTEN/NOTIFY: a change
made anywhere (another control plane, SQL by hand) is seen once its notification arrives
(here the periodic read comes only hourly, so nothing else can bring it), revocation
included; a change made here is seen before the call that made it returns. A bearer key
Postgres does not hold costs one read, however many ask at once or again; one that is not
shaped like ours, none."""
import asyncio
from contextlib import contextmanager
from datetime import datetime, timezone
from decimal import Decimal

import asyncpg
import pytest
import pytest_asyncio

from sqlalchemy import event

from controlplane.auth.keys import NewKey, generate_key, hash_key
from controlplane.lookups.listener import libpq_dsn
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    # unknown keys are remembered for ten minutes, and the whole cache is read again only
    # hourly: what brings a change made elsewhere into memory here is its notification
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-lookups"),
                             unknown_key_ttl_s=600.0, cache_refresh_s=3600.0)
    async with running_control_plane(settings) as plane:
        yield plane


@pytest_asyncio.fixture(loop_scope="session")
async def elsewhere(db_url):
    """A connection of its own: what another control plane, or an operator, writes with."""
    conn = await asyncpg.connect(libpq_dsn(db_url))
    yield conn
    await conn.close()


async def refused_once_notified(client) -> None:
    """The key refused: the notification of its change reached this plane (no refresh comes
    within the hour)."""
    await eventually(lambda: _refused(client), timeout_s=10, every_s=0.01, what="the revoked key refused")


async def _refused(client) -> bool:
    return (await client.get("/v1/deployments")).status_code == 401


async def test_a_key_revoked_through_the_api_is_refused_at_once(plane):
    client = plane.client(await plane.tenant_key("revoked-here"))
    assert (await client.get("/v1/deployments")).status_code == 200
    prefix = (await plane.admin.get("/v1/tenants/revoked-here/keys")).json()["data"][0]["prefix"]
    assert (await plane.admin.delete(f"/v1/keys/{prefix}")).status_code == 200
    response = await client.get("/v1/deployments")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"


async def test_a_key_revoked_elsewhere_is_refused_once_notified(plane, elsewhere):
    secret = await plane.tenant_key("revoked-elsewhere")
    client = plane.client(secret)
    assert (await client.get("/v1/deployments")).status_code == 200
    assert plane.app.state.lookups.cache.key(hash_key(secret)) is not None, "served from memory"
    await elsewhere.execute("UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1",
                            hash_key(secret))
    await refused_once_notified(client)


async def test_prices_and_traffic_changed_elsewhere_reach_memory_once_notified(
        plane, elsewhere, model_uri):
    client = plane.client(await plane.tenant_key("moved"))
    created = await client.post("/v1/deployments", json={"name": "moved", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    deployment_id = created.json()["id"]
    lookups = plane.app.state.lookups
    tenant_id = next(d for d, _ in lookups.cache.deployments.values() if d.id == deployment_id
                     ).tenant_id
    await elsewhere.execute(
        "INSERT INTO prices (id, tenant_id, input_per_mtok, cached_input_per_mtok, "
        "output_per_mtok, gpu_second, per_call, effective_from, created_at) VALUES "
        "(gen_random_uuid(), $1, 42, 0, 0, 0, 0, now(), now())", tenant_id)
    await elsewhere.execute("UPDATE deployments SET traffic = '{\"r1\": 100, \"r9\": 0}' "
                            "WHERE id = $1", deployment_id)

    def seen() -> bool:
        price = lookups.pricing(tenant_id, deployment_id, datetime.now(timezone.utc))
        deployment, _ = lookups.cache.deployment(tenant_id, "moved")
        return price.input_per_mtok == Decimal(42) and "r9" in deployment.traffic

    await eventually(seen, timeout_s=10, every_s=0.01, what="both changes in memory")


async def test_the_listener_reconnects_and_reloads_what_it_missed(plane, elsewhere):
    """Its connection killed (a failover, an idle-connection reaper), the listener comes
    back on its own and reads everything again: a revocation made meanwhile is seen."""
    secret = await plane.tenant_key("missed")
    client = plane.client(secret)
    assert (await client.get("/v1/deployments")).status_code == 200
    listener = plane.app.state.lookups.listener
    before = listener.backend_pid
    assert await elsewhere.fetchval("SELECT pg_terminate_backend($1)", before)
    await elsewhere.execute("UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1",
                            hash_key(secret))
    await refused_once_notified(client)      # read again whole once the listener is back
    await eventually(lambda: listener.connected.is_set() and listener.backend_pid != before,
                     timeout_s=5, what="a new listening connection")


@contextmanager
def key_reads(plane, secret: str):
    """The statements the control plane sends Postgres that carry this secret's hash,
    counted at its engine as they go out."""
    key_hash, seen = hash_key(secret), []

    def count(conn, cursor, statement, parameters, context, executemany):
        if key_hash in repr(parameters):
            seen.append(statement)

    engine = plane.app.state.db_engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


async def _refused_as_invalid(response) -> bool:
    return response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"


@pytest.mark.parametrize("secret", ["tp_nothere_secret", "x" * 55, generate_key().secret + "x",
                                    generate_key().secret.replace("_", "-", 1)])
async def test_a_key_not_shaped_like_ours_is_refused_without_a_read(plane, secret):
    with key_reads(plane, secret) as reads:
        responses = [await plane.client(secret).get("/v1/deployments") for _ in range(3)]
    assert all([await _refused_as_invalid(r) for r in responses])
    assert reads == []


async def test_a_flood_of_one_unknown_key_costs_one_read_and_the_key_made_then_works(
        plane, monkeypatch):
    from controlplane.store import tenants

    secret = generate_key().secret
    client = plane.client(secret)
    with key_reads(plane, secret) as reads:
        together = await asyncio.gather(*[client.get("/v1/deployments") for _ in range(20)])
        after = [await client.get("/v1/deployments") for _ in range(5)]
    assert all([await _refused_as_invalid(r) for r in [*together, *after]])
    assert len(reads) == 1, reads
    # the very key is created now: known at once, its unknown mark forgotten
    monkeypatch.setattr(tenants, "generate_key",
                        lambda: NewKey(secret, secret[:11], hash_key(secret)))
    await plane.admin.post("/v1/tenants", json={"name": "flooded"})
    created = await plane.admin.post("/v1/tenants/flooded/keys", json={"scopes": ["deploy"]})
    assert created.status_code == 201 and created.json()["key"] == secret
    assert (await client.get("/v1/deployments")).status_code == 200


async def test_an_unknown_key_made_elsewhere_is_known_once_notified(plane, elsewhere):
    secret = generate_key().secret
    client = plane.client(secret)
    assert await _refused_as_invalid(await client.get("/v1/deployments"))   # marked unknown
    other = await plane.tenant_key("made-elsewhere")
    await elsewhere.execute("UPDATE api_keys SET key_hash = $1 WHERE key_hash = $2",
                            hash_key(secret), hash_key(other))

    async def served() -> bool:
        return (await client.get("/v1/deployments")).status_code == 200

    await eventually(served, timeout_s=10, every_s=0.01, what="the key made elsewhere served")
