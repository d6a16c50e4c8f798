"""API errors: `{"error": {"message", "type", "param", "code"}}` (wire.errors) with the
right status, and the one mapping from domain errors to statuses."""
from __future__ import annotations

import json
import logging
import math
import re
from typing import Optional

import asyncpg
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from controlplane.store.errors import (AlreadyExists, Conflict, DatabaseUnavailable, Forbidden,
                                       InvalidField, NotFound, StaticQuotaExceeded, Unavailable)
from controlplane.store.failures import is_outage
from pool.api import PoolError
from wire.errors import ProtocolError, error_body
from wire.request_id import Send

log = logging.getLogger("thawpool.app")


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: Optional[str] = None,
                 retry_after_s: Optional[float] = None, param: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.param = param

    def body(self) -> dict[str, object]:
        return error_body(self.message, self.status, param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def response(self) -> Response:
        """ASCII JSON: a message may echo what the client sent, lone surrogates included."""
        return Response(json.dumps(self.body()), status_code=self.status,
                        headers=self.headers(), media_type="application/json")

    async def send_to(self, send: Send) -> None:
        """The error as a whole response, for plain ASGI middleware."""
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers().items()]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(self.body()).encode()})


def api_error_for(exc: Exception) -> ApiError:
    """The status and code of a refusal raised below the routes."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc), code=f"{exc.kind}_not_found")
    if isinstance(exc, AlreadyExists):
        return ApiError(409, str(exc), code=f"{exc.kind}_exists")
    if isinstance(exc, Conflict):
        return ApiError(409, str(exc), code=exc.code)
    if isinstance(exc, InvalidField):
        return ApiError(422, str(exc), code="invalid_field", param=exc.field)
    if isinstance(exc, StaticQuotaExceeded):
        return ApiError(422, str(exc), code="quota_exceeded", param=exc.limit)
    if isinstance(exc, Forbidden):
        return ApiError(403, str(exc), code=exc.code, param=exc.field)
    if isinstance(exc, DatabaseUnavailable):
        return ApiError(503, str(exc), code="database_unavailable", retry_after_s=5.0)
    if isinstance(exc, Unavailable):
        return ApiError(503, str(exc), code="storage_unavailable", retry_after_s=5.0)
    if isinstance(exc, ProtocolError):
        return ApiError(exc.status, exc.message, code=exc.code, param=exc.param)
    if isinstance(exc, PoolError):
        retry = exc.retry_after_s if exc.retry_after_s is not None else (
            5.0 if exc.status in (429, 503) else None)
        return ApiError(exc.status, str(exc) or type(exc).__name__,
                        code=_snake(type(exc).__name__), retry_after_s=retry)
    if isinstance(exc, HTTPException):
        return ApiError(exc.status_code, str(exc.detail))
    raise TypeError(f"no status for {type(exc).__name__}") from exc


async def refusal_handler(request: Request, exc: Exception) -> Response:
    return api_error_for(exc).response()


async def database_error_handler(request: Request, exc: Exception) -> Response:
    """Postgres down, unreachable or too slow: 503 with Retry-After, never a 500."""
    if is_outage(exc):
        log.warning("database unavailable", extra={
            "request_id": getattr(request.state, "request_id", None), "error": repr(exc)[:300]})
        return api_error_for(DatabaseUnavailable("the database did not answer; retry shortly")
                             ).response()
    return await unhandled_error_handler(request, exc)


async def unhandled_error_handler(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc,
              extra={"request_id": getattr(request.state, "request_id", None)})
    return ApiError(500, "internal error").response()


# Every refusal type the routes let through; one handler answers them all.
REFUSALS = (ApiError, NotFound, AlreadyExists, Conflict, InvalidField, StaticQuotaExceeded, Forbidden,
            Unavailable, ProtocolError, PoolError, HTTPException)
# What a database call raises when Postgres is away (asyncio's timeouts are OSErrors).
DATABASE_ERRORS = (sa_exc.DBAPIError, sa_exc.TimeoutError, asyncpg.PostgresError,
                   asyncpg.InterfaceError, OSError)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
