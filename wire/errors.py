"""The one error shape of both servers: `{"error": {"message", "type", "param", "code"}}`.

`type` follows the HTTP status (OpenAI's names); `code` is a short snake_case
word a client can switch on, or null; `param` names the offending field.
"""
from __future__ import annotations

import json
from typing import Any, Optional

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
    413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error",
    499: "client_closed_request", 500: "server_error", 502: "upstream_error",
    503: "service_unavailable",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, status: int = 400, *, param: Optional[str] = None,
               code: Optional[str] = None, type: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type or error_type(status),
                      "param": param, "code": code}}


def message_of(raw: bytes) -> str:
    """The message of an error body in this shape (what a replica answered), or the start
    of whatever was sent instead."""
    try:
        return str(json.loads(raw)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace")


class ProtocolError(ValueError):
    """A request refused for what it says; `param` names the field when there is one."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code

    @classmethod
    def from_value_error(cls, exc: ValueError,
                         rename: Optional[dict[str, str]] = None) -> "ProtocolError":
        """SamplingParams and engine messages start with 'field: ...'; keep that field."""
        message = str(exc)
        head, sep, _ = message.partition(":")
        param = head.strip() if sep and head.strip().isidentifier() else None
        if param and rename and param in rename:
            message = rename[param] + message[len(head):]
            param = rename[param]
        return cls(message, param=param)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, param=self.param, code=self.code)
