"""LISTEN on one Postgres channel over a connection of its own, for as long as it runs.

The connection is checked every `check_s` (a blackholed server never closes it) and
re-made with backoff when it is lost; `on_connect` runs after every (re)connect, since
notices sent while no one listened are gone (the cache reloads everything then).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable, Optional

import asyncpg
from sqlalchemy.engine import make_url

log = logging.getLogger("thawpool.listener")


def libpq_dsn(sqlalchemy_url: str) -> str:
    """postgresql+asyncpg://... as asyncpg.connect takes it: SQLAlchemy's `ssl=require`
    is libpq's `sslmode=require` (asyncpg would send an unknown `ssl` to the server)."""
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    query = dict(url.query)
    ssl = query.pop("ssl", None)
    if ssl is not None:
        query.setdefault("sslmode", ssl)
    return url.set(query=query).render_as_string(hide_password=False)


class Listener:
    def __init__(self, dsn: str, channel: str, on_notice: Callable[[str], None],
                 on_connect: Callable[[], None], *, timeout_s: float = 5.0,
                 check_s: float = 5.0, max_backoff_s: float = 5.0):
        self.dsn = dsn
        self.channel = channel
        self.on_notice = on_notice
        self.on_connect = on_connect
        self.timeout_s = timeout_s
        self.check_s = check_s
        self.max_backoff_s = max_backoff_s
        self.connected = asyncio.Event()
        self.backend_pid: Optional[int] = None     # the server process listening (tests)
        self._task: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"listen-{self.channel}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self.dsn, timeout=self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - down or unreachable: try again
                log.debug("listener cannot connect: %r", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            backoff = 0.1
            try:
                await self._listen(conn)
            except Exception as exc:  # noqa: BLE001 - lost mid-way: reconnect
                log.warning("listener lost its connection, reconnecting",
                            extra={"error": repr(exc)[:300]})
            finally:
                self.connected.clear()
                conn.terminate()           # no goodbye to a server that may not answer

    async def _listen(self, conn: Any) -> None:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(self.channel, self._heard)
        self.backend_pid = conn.get_server_pid()
        self.connected.set()
        self.on_connect()
        while True:
            try:
                await asyncio.wait_for(lost.wait(), self.check_s)
            except asyncio.TimeoutError:
                await conn.fetchval("SELECT 1", timeout=self.timeout_s)   # raises if blackholed
                continue
            log.warning("listener connection closed by the server, reconnecting")
            return

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_notice(payload)
