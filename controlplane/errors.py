"""API errors as JSON `{"error": {"type", "message", "code"}}` with the right status."""
from __future__ import annotations

import json
import math
from typing import Optional

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 409: "conflict_error", 413: "request_too_large",
    422: "invalid_request_error", 429: "rate_limit_error", 502: "upstream_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: Optional[str] = None,
                 retry_after_s: Optional[float] = None, param: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.param = param

    def body(self) -> dict:
        error = {"type": _TYPES.get(self.status, "api_error"), "message": self.message,
                 "code": self.code}
        if self.param:
            error["param"] = self.param
        return {"error": error}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers())

    def raw(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Status, headers and body for plain ASGI middleware."""
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers().items()]
        return self.status, headers, json.dumps(self.body()).encode()

    async def send_to(self, send) -> None:
        status, headers, body = self.raw()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def invalid(field: str, message: str) -> ApiError:
    """422 naming the field: `scaling.min_replicas: must be <= max_replicas`."""
    return ApiError(422, f"{field}: {message}", code="invalid_field", param=field)


async def api_error_handler(request, exc: ApiError) -> JSONResponse:
    return exc.response()


async def http_exception_handler(request, exc) -> JSONResponse:
    return ApiError(exc.status_code, str(exc.detail)).response()


async def unhandled_error_handler(request, exc: Exception) -> JSONResponse:
    import logging

    logging.getLogger("thawpool.app").error(
        "unhandled error", exc_info=exc,
        extra={"request_id": getattr(request.state, "request_id", None)})
    return ApiError(500, "internal error").response()
