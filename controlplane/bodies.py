"""Reading JSON request bodies with a size limit (413) and a clear 400."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from controlplane.errors import ApiError


async def read_json(request: Request, max_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        raise ApiError(400, "body: a JSON object is required", param="body")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"body: invalid JSON ({exc.msg} at {exc.pos})", param="body") from None


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"body: larger than {max_bytes} bytes", code="body_too_large")
