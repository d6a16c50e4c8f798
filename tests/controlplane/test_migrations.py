"""Migrations build the schema from nothing and are idempotent."""
import asyncpg
from sqlalchemy.engine import make_url

from controlplane.db import migrate, migrate_async
from tests.controlplane.conftest import create_database, drop_database

TABLES = {"tenants", "api_keys", "deployments", "revisions", "usage_events",
          "replica_lifetimes", "alembic_version"}


async def test_upgrade_head_twice_on_a_fresh_database(pg_server):
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        migrate(url)     # from inside a running loop: runs in a worker thread
        libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(libpq)
        try:
            names = {r["tablename"] for r in await conn.fetch(
                "select tablename from pg_tables where schemaname = 'public'")}
            version = await conn.fetchval("select version_num from alembic_version")
            cost_type = await conn.fetchval(
                "select data_type from information_schema.columns "
                "where table_name = 'usage_events' and column_name = 'cost'")
        finally:
            await conn.close()
        assert names == TABLES
        assert version == "0002"
        assert cost_type == "numeric"
    finally:
        await drop_database(pg_server, url)
