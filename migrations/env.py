"""Alembic environment on an async (asyncpg) engine.

The URL is handed in by controlplane.db.migrate via config.attributes["url"];
the `alembic` command line falls back to the settings object.
"""
from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

from controlplane.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url")
    if url:
        return url
    from controlplane.settings import Settings

    return Settings.from_env().database_url


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    db_engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with db_engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await db_engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
