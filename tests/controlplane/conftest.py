"""Control-plane fixtures: a fresh migrated database per test module, the app under a
real uvicorn, a model in real S3, and a real runtime replica for the gateway."""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import httpx
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from controlplane.app import create_app
from controlplane.db import migrate_async
from controlplane.settings import Settings
from controlplane.store.tenants import bootstrap_admin
from tests.controlplane.support.servers import RuntimeProcess, serve
from tests.controlplane.support.static_pool import StaticPool


async def create_database(pg_server) -> str:
    name = f"cp_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_server.libpq_uri)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return make_url(pg_server.url).set(database=name).render_as_string(hide_password=False)


async def drop_database(pg_server, url: str) -> None:
    conn = await asyncpg.connect(pg_server.libpq_uri)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def db_url(pg_server):
    """A fresh database with every migration applied, for one test module."""
    url = await create_database(pg_server)
    await migrate_async(url)
    yield url
    await drop_database(pg_server, url)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def own_pg(tmp_path_factory):
    """A migrated Postgres of the module's own, to stop and start (or freeze: see
    support/postgres.py); the session one stays up. Started again after each test."""
    from controlplane.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path_factory.mktemp("own-pg") / "data").start()
    try:
        await migrate_async(pg.url)
        yield pg
    finally:
        pg.stop()


@pytest.fixture(scope="session")
def models_bucket(s3_server) -> str:
    s3_server.ensure_bucket(MODELS_BUCKET)
    return MODELS_BUCKET


@pytest.fixture(scope="session")
def model_uri(tiny_model, s3_server, models_bucket) -> str:
    from tests.support.model_factory import upload_model

    return upload_model(tiny_model, s3_server.client(), models_bucket, "tiny/llama")


@pytest.fixture(scope="session")
def runtime_replica(tiny_model, tmp_path_factory):
    """One real `python -m runtime.serve.server` over the tiny model, for the whole session."""
    replica = RuntimeProcess(tiny_model, tmp_path_factory.mktemp("replica") / "runtime.log")
    try:
        replica.wait_ready()
        yield replica
    finally:
        replica.stop()


MODELS_BUCKET = "cp-models"
# The shared catalogue every tenant of a test control plane may deploy from (as an operator
# would grant one). Each tenant's own prefix is s3://cp-models/tenants/<tenant id>/, where
# its uploads land; the fixtures put models under s3://cp-models/<tenant name>/ with the
# platform's keys, which tenant_key grants the tenant it makes (as an operator grants a
# tenant the prefix its deployments used before the tenants/ namespace).
CATALOGUE = f"s3://{MODELS_BUCKET}/tiny/"


def legacy_prefix(tenant: str) -> str:
    return f"s3://{MODELS_BUCKET}/{tenant}/"
METRICS_TOKEN = "metrics-token-for-tests"


def make_settings(db_url: str, s3_server, data_dir, **overrides) -> Settings:
    base = dict(database_url=db_url, data_dir=data_dir, s3_endpoint=s3_server.endpoint,
                aws_access_key_id=s3_server.access_key,
                aws_secret_access_key=s3_server.secret_key, usage_flush_interval_s=0.01,
                models_bucket=MODELS_BUCKET, upload_part_bytes=5 * 1024 ** 2,
                metrics_token=METRICS_TOKEN)
    return Settings(**{**base, **overrides})


@dataclass
class ControlPlane:
    """A running control plane and an admin key for it."""
    base_url: str
    app: object
    admin_key: str
    clients: list = field(default_factory=list)

    def client(self, key: str | None = None, **kw) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=60, **kw)
        self.clients.append(client)
        return client

    @property
    def admin(self) -> httpx.AsyncClient:
        return self.client(self.admin_key)

    async def tenant_key(self, tenant: str, scopes=("invoke", "deploy", "billing:read"),
                         **limits) -> str:
        admin = self.admin
        response = await admin.post("/v1/tenants", json={"name": tenant})
        assert response.status_code in (201, 409), response.text
        if response.status_code == 201:
            await self.grant(legacy_prefix(tenant), tenant)
        response = await admin.post(f"/v1/tenants/{tenant}/keys",
                                    json={"scopes": list(scopes), **limits})
        assert response.status_code == 201, response.text
        return response.json()["key"]

    async def flush_usage(self) -> None:
        await self.app.state.writer.flush()

    async def set_price(self, **row) -> dict:
        """A price-book row through the admin API (see controlplane.routes.prices)."""
        response = await self.admin.post("/v1/price-book", json=row)
        assert response.status_code == 201, response.text
        return response.json()

    async def grant(self, prefix: str, tenant: str | None = None) -> dict:
        response = await self.admin.post("/v1/model-sources",
                                         json={"prefix": prefix, "tenant": tenant})
        assert response.status_code == 201, response.text
        return response.json()


def cpu_pool_settings(s3_server, cache_dir, **overrides):
    """One CPU slot, one-thread replicas, weights from the session S3."""
    from pool.settings import PoolSettings

    base = dict(accelerator="cpu", cpu_slots=1, slot_memory_gb=2, warm_pool_size=0, tick_s=0.2,
                runtime_threads=1, kv_cache_tokens_default=512, cache_dir=cache_dir,
                s3_endpoint=s3_server.endpoint, aws_access_key_id=s3_server.access_key,
                aws_secret_access_key=s3_server.secret_key, load_timeout_s=180)
    return PoolSettings(**{**base, **overrides})


def real_pool(pool_settings, clock=None):
    """A pool_factory for create_app: the real PoolManager over the app's desired state
    (on `clock`, e.g. a tests.support.clock.SteppedClock, when given)."""
    from pool.manager import PoolManager

    return lambda desired, events: PoolManager(pool_settings, desired, events, clock=clock)


def static_pool(settings: Settings, base_urls: list[str] | None = None) -> StaticPool:
    """A StaticPool reading models from the settings' S3 (start and stop it yourself)."""
    return StaticPool(settings.s3_endpoint, settings.aws_access_key_id,
                      settings.aws_secret_access_key, base_urls=base_urls or [])


@contextlib.asynccontextmanager
async def started_static_pool(settings: Settings, base_urls: list[str]) -> AsyncIterator[StaticPool]:
    """`static_pool` over `base_urls`, started, and stopped however the block ends."""
    pool = static_pool(settings, base_urls)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.stop()


@contextlib.asynccontextmanager
async def running_control_plane(settings: Settings, pool=None, pool_factory=None,
                                catalogue: str | None = CATALOGUE, base_urls=()):
    """The app under uvicorn with an admin key, `catalogue` granted to every tenant; with
    neither a pool nor a pool_factory, over a StaticPool of the runtime servers at
    `base_urls` (deploys are checked in the real S3)."""
    async with contextlib.AsyncExitStack() as stack:
        if pool is None and pool_factory is None:
            pool = static_pool(settings, list(base_urls))
            await pool.start()
            stack.push_async_callback(pool.stop)
        app = create_app(settings, pool=pool, pool_factory=pool_factory)
        base_url = await stack.enter_async_context(serve(app))
        async with app.state.sessions.begin() as session:
            new = await bootstrap_admin(session)
        if new is None:      # the module's database already has one: make another
            from controlplane.store.tenants import create_key, find_tenant

            async with app.state.sessions.begin() as session:
                _, new = await create_key(session, await find_tenant(session, "system"),
                                          ["admin"])
        plane = ControlPlane(base_url, app, new.secret)
        if catalogue is not None:
            listed = await plane.admin.get("/v1/model-sources")
            if catalogue not in [g["prefix"] for g in listed.json()["data"]]:
                await plane.grant(catalogue)
        try:
            yield plane
        finally:
            for client in plane.clients:
                await client.aclose()


@contextlib.asynccontextmanager
async def pooled_control_plane(db_url: str, s3_server, tmp, **pool_overrides):
    """The control plane over the real PoolManager on CPU slots, cold-starting real
    runtime replicas."""
    settings = make_settings(db_url, s3_server, tmp / "cp", acquire_timeout_s=240)
    pool_factory = real_pool(cpu_pool_settings(s3_server, tmp / "cache", **pool_overrides))
    async with running_control_plane(settings, pool_factory=pool_factory) as plane:
        yield plane
