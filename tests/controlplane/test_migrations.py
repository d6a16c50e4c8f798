"""Migrations build the schema from nothing, are idempotent, keep the past bill, and
notify every change of what the control plane caches."""
import asyncio
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from controlplane.db import alembic_config, migrate, migrate_async
from tests.controlplane.conftest import create_database, drop_database

TABLES = {"tenants", "api_keys", "deployments", "revisions", "usage_events",
          "replica_lifetimes", "model_sources", "prices", "tenant_quotas", "model_uploads",
          "function_calls", "adapters", "gpu_costs", "stored_responses", "batch_files", "batches",
          "batch_lines", "budgets", "budget_periods", "budget_reservations", "budget_alerts",
          "webhook_endpoints", "webhook_events", "webhook_deliveries", "webhook_attempts",
          "alembic_version"}
T0 = datetime(2026, 5, 1, tzinfo=timezone.utc)
IDS = ("'00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-000000000002', "
       "'00000000-0000-0000-0000-000000000003'")


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def test_upgrade_head_twice_on_a_fresh_database(pg_server):
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        migrate(url)     # from inside a running loop: runs in a worker thread
        conn = await asyncpg.connect(libpq(url))
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
        heads = ScriptDirectory.from_config(alembic_config(url)).get_heads()
        assert len(heads) == 1, f"migrations branch: heads {heads}"
        assert version == heads[0]
        assert cost_type == "numeric"
    finally:
        await drop_database(pg_server, url)


async def test_0004_keeps_the_bill_of_older_lifetimes_and_goes_down_again(pg_server):
    """A closed row that held slots keeps [started, stopped); an open one is last seen at
    its ready time (a heartbeat continues or closes it); one that never held slots bills
    nothing."""
    url = await create_database(pg_server)
    try:
        await asyncio.to_thread(migrate, url, "0003")
        conn = await asyncpg.connect(libpq(url))
        try:
            for replica, slots, ready, stopped in [("closed", ["gpu0"], 10, 70),
                                                   ("open", ["gpu0"], 10, None),
                                                   ("waiting", [], None, None)]:
                await conn.execute(
                    "INSERT INTO replica_lifetimes (replica_id, revision_id, deployment_id, "
                    f"tenant_id, gpu_count, slot_ids, state, started_at, ready_at, stopped_at) "
                    f"VALUES ($1, {IDS}, 1, $2, 'x', $3, $4, $5)", replica, slots, T0,
                    None if ready is None else T0 + timedelta(seconds=ready),
                    None if stopped is None else T0 + timedelta(seconds=stopped))
            await asyncio.to_thread(migrate, url)
            rows = {r["replica_id"]: (r["placed_at"], r["last_seen_at"]) for r in await conn.fetch(
                "SELECT replica_id, placed_at, last_seen_at FROM replica_lifetimes")}
            assert rows == {"closed": (T0, T0 + timedelta(seconds=70)),
                            "open": (T0, T0 + timedelta(seconds=10)),
                            "waiting": (None, T0)}
            await asyncio.to_thread(command.downgrade, alembic_config(url), "0003")
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == "0003"
            await asyncio.to_thread(migrate, url)
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server, url)


async def test_0018_keeps_one_cost_per_kind_and_time_and_0017_0018_go_down_again(pg_server):
    """The default's NULL kind counts as one kind: a second default at the same time is
    refused, as is a second row of one kind; down to 0016 both the cost book and the
    lifetimes' kind go, and come back."""
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        conn = await asyncpg.connect(libpq(url))
        try:
            insert = ("INSERT INTO gpu_costs (id, gpu_kind, per_gpu_second, effective_from, "
                      "created_at) VALUES (gen_random_uuid(), $1, 0.001, $2, now())")
            for kind in (None, "cuda"):
                await conn.execute(insert, kind, T0)
                with pytest.raises(asyncpg.UniqueViolationError):
                    await conn.execute(insert, kind, T0)
            await asyncio.to_thread(command.downgrade, alembic_config(url), "0016")
            assert await conn.fetchval("SELECT to_regclass('gpu_costs')") is None
            assert await conn.fetchval(
                "SELECT count(*) FROM information_schema.columns WHERE "
                "table_name = 'replica_lifetimes' AND column_name = 'gpu_kind'") == 0
            await asyncio.to_thread(migrate, url)
            assert await conn.fetchval("SELECT count(*) FROM gpu_costs") == 0
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server, url)


async def test_0023_prices_have_a_tier_and_batches_go_down_again(pg_server):
    """A batch row may share a scope and time with the interactive one, not another batch
    row; rows written before 0023 are interactive; down to 0018 the batch rows and the
    batch tables go, and come back empty."""
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        conn = await asyncpg.connect(libpq(url))
        try:
            insert = ("INSERT INTO prices (id, input_per_mtok, cached_input_per_mtok, output_per_mtok, "
                      "gpu_second, per_call, effective_from, created_at{}) VALUES (gen_random_uuid(), "
                      "1, 1, 1, 0, 0, $1, now(){})")
            await conn.execute(insert.format("", ""), T0)
            await conn.execute(insert.format(", tier", ", 'batch'"), T0)
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(insert.format(", tier", ", 'batch'"), T0)
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(insert.format(", tier", ", 'bulk'"), T0 + timedelta(days=1))
            assert sorted(await conn.fetch("SELECT tier FROM prices")) == [("batch",), ("interactive",)]
            await asyncio.to_thread(command.downgrade, alembic_config(url), "0018")
            assert await conn.fetchval("SELECT to_regclass('batch_lines')") is None
            assert await conn.fetchval("SELECT count(*) FROM prices") == 1
            await asyncio.to_thread(migrate, url)
            assert await conn.fetchval("SELECT tier FROM prices") == "interactive"
            assert await conn.fetchval("SELECT count(*) FROM batches") == 0
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server, url)


async def test_0019_keeps_one_budget_per_scope_and_goes_down_again(pg_server):
    """One budget per tenant, key or deployment; a reservation names a period that exists;
    down to 0018 the budget tables go, and come back."""
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        conn = await asyncpg.connect(libpq(url))
        try:
            tenant = await conn.fetchval("INSERT INTO tenants (id, name, created_at) "
                                         "VALUES (gen_random_uuid(), 'b', now()) RETURNING id")
            insert = ("INSERT INTO budgets (id, tenant_id, scope, scope_id, limit_amount, period, created_at, "
                      "updated_at) VALUES (gen_random_uuid(), $1, 'tenant', $1, 10, 'month', now(), now())")
            await conn.execute(insert, tenant)
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(insert, tenant)
            with pytest.raises(asyncpg.ForeignKeyViolationError):
                await conn.execute("INSERT INTO budget_reservations (invocation_id, budget_id, period_start, "
                                   "amount, expires_at) SELECT gen_random_uuid(), id, now(), 1, now() FROM budgets")
            await asyncio.to_thread(command.downgrade, alembic_config(url), "0018")
            assert await conn.fetchval("SELECT to_regclass('budgets')") is None
            await asyncio.to_thread(migrate, url)
            assert await conn.fetchval("SELECT count(*) FROM budget_periods") == 0
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server, url)


async def test_0009_function_calls_hold_their_invariant_and_go_down_again(pg_server):
    """A call is running exactly while it has no end; 0008 has no such table."""
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        conn = await asyncpg.connect(libpq(url))
        try:
            tenant = await conn.fetchval("INSERT INTO tenants (id, name, created_at) VALUES "
                                         "(gen_random_uuid(), 't', now()) RETURNING id")
            insert = ("INSERT INTO function_calls (id, tenant_id, deployment_name, status, "
                      "created_at, finished_at) VALUES ($1, $2, 'f', $3, now(), $4)")
            await conn.execute(insert, "call-ok", tenant, "succeeded", T0)
            for status, finished in [("succeeded", None), ("running", T0), ("lost", T0)]:
                with pytest.raises(asyncpg.CheckViolationError):
                    await conn.execute(insert, f"call-{status}", tenant, status, finished)
            await asyncio.to_thread(command.downgrade, alembic_config(url), "0008")
            assert await conn.fetchval("SELECT to_regclass('function_calls')") is None
            await asyncio.to_thread(migrate, url)
            assert await conn.fetchval("SELECT count(*) FROM function_calls") == 0
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server, url)


async def test_changes_of_cached_tables_are_notified_at_commit(pg_server):
    url = await create_database(pg_server)
    try:
        await migrate_async(url)
        listener, writer = await asyncpg.connect(libpq(url)), await asyncpg.connect(libpq(url))
        heard: asyncio.Queue[str] = asyncio.Queue()
        try:
            await listener.add_listener("thawpool_cache", lambda *args: heard.put_nowait(args[3]))
            tenant = await writer.fetchval("INSERT INTO tenants (id, name, created_at) VALUES "
                                           "(gen_random_uuid(), 'n', now()) RETURNING id")
            key = await writer.fetchval(
                "INSERT INTO api_keys (id, tenant_id, prefix, key_hash, scopes, created_at) "
                "VALUES (gen_random_uuid(), $1, 'tp_00000000', 'h', '{invoke}', now()) "
                "RETURNING id", tenant)
            assert await asyncio.wait_for(heard.get(), 5) == f"api_keys:{key}"
            async with writer.transaction():
                await writer.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", key)
                await writer.execute("INSERT INTO tenant_quotas (tenant_id, tokens_per_min, "
                                     "updated_at) VALUES ($1, 5, now())", tenant)
                assert heard.empty(), "nothing is heard before the commit"
            got = {await asyncio.wait_for(heard.get(), 5) for _ in range(2)}
            assert got == {f"api_keys:{key}", f"tenant_quotas:{tenant}"}
        finally:
            await listener.close()
            await writer.close()
    finally:
        await drop_database(pg_server, url)
