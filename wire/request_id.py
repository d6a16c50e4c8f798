"""One request id through every hop: the client's X-Request-Id when well formed, else new.

Both servers run `RequestIdMiddleware`: the control plane accepts or makes the
id and sends it on to the replica, which keeps it as the engine's request id,
so the client's id, the logs of both sides and the usage row agree. Only ids
that are safe to log and to echo in a header are kept.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any, Awaitable, Callable, Iterable, MutableMapping, Optional

REQUEST_ID_HEADER = b"x-request-id"
ACCESS_FIELDS = "access_fields"     # scope["state"] key: see access_fields
_VALID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def access_fields(scope: Scope) -> dict[str, Any]:
    """What a route adds to its request's access log line (one line per request: an
    invocation's deployment, outcome and tokens ride on it rather than a line of their
    own, a second line's formatting and write on every call)."""
    fields: dict[str, Any] = scope.setdefault("state", {}).setdefault(ACCESS_FIELDS, {})
    return fields


def request_id_from(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            candidate = value.decode("latin-1").strip()
            if _VALID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Puts the id in scope["state"]["request_id"] and echoes it on every response;
    with `access_log`, writes one line per request (method, path, status, seconds)."""

    def __init__(self, app: ASGIApp, access_log: Optional[logging.Logger] = None):
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(scope.get("headers", []))
        scope.setdefault("state", {})["request_id"] = request_id
        fields = access_fields(scope)
        started, status = time.perf_counter(), [500]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [h for h in message.get("headers", []) if h[0] != REQUEST_ID_HEADER]
                message["headers"] = headers + [(REQUEST_ID_HEADER, request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log is not None:
                self.access_log.info("request", extra={
                    **fields, "request_id": request_id, "method": scope["method"], "path": scope["path"],
                    "status": status[0], "duration_s": round(time.perf_counter() - started, 6)})
