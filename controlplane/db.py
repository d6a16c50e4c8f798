"""The SQLAlchemy engine ("db_engine" throughout), sessions and programmatic migrations."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import (AsyncEngine, AsyncSession, async_sessionmaker,
                                    create_async_engine)

if TYPE_CHECKING:
    from alembic.config import Config


def migrations_dir() -> Path:
    """migrations/ beside controlplane/ (a checkout), else the installed package."""
    beside = Path(__file__).resolve().parent.parent / "migrations"
    if (beside / "env.py").exists():
        return beside
    import migrations

    return Path(next(iter(migrations.__path__)))


def alembic_config(url: str) -> "Config":
    from alembic.config import Config

    config = Config(str(migrations_dir() / "alembic.ini"))
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["url"] = url
    return config


def migrate(url: str, revision: str = "head") -> None:
    """`alembic upgrade head` on `url`; safe to call from inside a running event loop."""
    from alembic import command

    def run() -> None:
        command.upgrade(alembic_config(url), revision)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        run()
        return
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    worker = threading.Thread(target=in_thread, name="alembic-upgrade")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


async def migrate_async(url: str) -> None:
    await asyncio.to_thread(migrate, url)


def create_db_engine(url: str, *, connect_timeout_s: float = 5.0,
                     statement_timeout_s: float = 15.0, pool_timeout_s: float = 5.0,
                     **kw: Any) -> AsyncEngine:
    """Every wait on Postgres is bounded: connecting, each statement (asyncpg's
    command_timeout, also the pre-ping's) and a free connection from the pool, so a
    database that stops answering fails calls fast instead of hanging them."""
    kw.setdefault("pool_pre_ping", True)
    kw.setdefault("pool_size", 10)
    kw.setdefault("pool_timeout", pool_timeout_s)
    kw.setdefault("connect_args", {"timeout": connect_timeout_s,
                                   "command_timeout": statement_timeout_s})
    return create_async_engine(url, **kw)


def sessionmaker(db_engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(db_engine, expire_on_commit=False)
