"""X-Request-Id on every request and response, and one JSON access-log line each."""
from __future__ import annotations

import logging
import re
import time
import uuid

log = logging.getLogger("thawpool.access")
_VALID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_from(headers) -> str:
    for name, value in headers:
        if name == b"x-request-id":
            candidate = value.decode("latin-1").strip()
            if _VALID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Accepts a well-formed X-Request-Id or makes one; echoes it; logs the outcome."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = request_id_from(scope["headers"])
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = [500]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info("request", extra={
                "request_id": request_id, "method": scope["method"], "path": scope["path"],
                "status": status[0], "duration_s": round(time.perf_counter() - started, 6)})
