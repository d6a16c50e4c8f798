"""What a database failure means: an outage (try again later) or a refusal of the data.

Drivers wrap each other's exceptions (SQLAlchemy over asyncpg over the socket), so
both questions walk the chain of causes. An outage is the server down, unreachable,
shutting down, out of connections or past a timeout; a refusal is Postgres (or the
driver, before sending) rejecting the values themselves (SQLSTATE classes 22 data
exception and 23 integrity violation), which no retry will change.
"""
from __future__ import annotations

from typing import Iterator, Optional

import asyncpg
from sqlalchemy import exc as sa_exc

OUTAGE_CLASSES = ("08", "53", "57", "58")       # connection, resources, operator, system
REFUSAL_CLASSES = ("22", "23")                  # data exception, integrity violation


def is_outage(exc: BaseException) -> bool:
    """The database did not answer, or not in time: serve from memory, retry later."""
    for cause in _chain(exc):
        if isinstance(cause, (OSError, sa_exc.TimeoutError, asyncpg.ConnectionDoesNotExistError,
                              asyncpg.InternalClientError)):
            return True
        if isinstance(cause, sa_exc.DBAPIError) and cause.connection_invalidated:
            return True
        if _sqlstate_class(cause) in OUTAGE_CLASSES:
            return True
    return False


def is_refusal(exc: BaseException) -> bool:
    """Postgres (or the driver) refused the values: retrying the same row never helps."""
    return not is_outage(exc) and any(
        _sqlstate_class(cause) in REFUSAL_CLASSES for cause in _chain(exc))


def _sqlstate_class(exc: BaseException) -> Optional[str]:
    state = getattr(exc, "sqlstate", None)
    return state[:2] if isinstance(state, str) else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending: list[Optional[BaseException]] = [exc]
    while pending:
        cause = pending.pop()
        if cause is None or id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        orig = getattr(cause, "orig", None)
        pending += [orig if isinstance(orig, BaseException) else None,
                    cause.__cause__, cause.__context__]
