"""The OpenAI Batch API: POST /v1/batches, GET /v1/batches, GET /v1/batches/{id},
POST /v1/batches/{id}/cancel (work: controlplane.batch.service; the lines run in
controlplane.batch.runner). A tenant reaches only its own batches (404 for another's)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.batch.service import BatchView
from controlplane.routes.api import ApiRoute, Operation, Param, scope
from controlplane.routes.context import app_state, read_json, require
from wire.errors import ProtocolError

MAX_LIST = 100


async def create(request: Request) -> Response:
    principal = require(request, "invoke")
    state = app_state(request)
    created = await state.batches.create(principal, await read_json(request))
    state.batch_runner.wake()
    return JSONResponse(view(created))


async def list_all(request: Request) -> Response:
    principal = require(request, "invoke")
    raw = request.query_params.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST:
        raise ProtocolError(f"limit: an integer from 1 to {MAX_LIST}", param="limit")
    views = await app_state(request).batches.list(principal.tenant_id, int(raw),
                                                  request.query_params.get("after"))
    data = [view(v) for v in views]
    return JSONResponse({"object": "list", "data": data, "has_more": len(data) == int(raw),
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})


async def get(request: Request) -> Response:
    principal = require(request, "invoke")
    return JSONResponse(view(await app_state(request).batches.get(
        principal.tenant_id, request.path_params["id"])))


async def cancel(request: Request) -> Response:
    principal = require(request, "invoke")
    state = app_state(request)
    cancelled = await state.batches.cancel(principal.tenant_id, request.path_params["id"])
    state.batch_runner.wake()
    return JSONResponse(view(cancelled))


def view(shown: BatchView) -> dict[str, Any]:
    """OpenAI's batch object (times in Unix seconds)."""
    b = shown.batch
    return {"id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": None,
            "input_file_id": b.input_file_id, "completion_window": b.completion_window,
            "status": b.status, "output_file_id": b.output_file_id,
            "error_file_id": b.error_file_id, "created_at": _unix(b.created_at),
            "in_progress_at": _unix(b.created_at), "expires_at": _unix(b.expires_at),
            "finalizing_at": _unix(b.finalizing_at), "completed_at": _unix(b.completed_at),
            "failed_at": None, "expired_at": _unix(b.expired_at),
            "cancelling_at": _unix(b.cancelling_at), "cancelled_at": _unix(b.cancelled_at),
            "request_counts": shown.counts.as_openai(), "metadata": b.batch_metadata}


def _unix(at: Optional[datetime]) -> Optional[int]:
    return None if at is None else int(at.timestamp())


BATCH = {"type": "object", "required": ["id", "object", "endpoint", "input_file_id",
                                        "completion_window", "status", "created_at",
                                        "request_counts"],
         "properties": {"id": {"type": "string"}, "object": {"enum": ["batch"]},
                        "status": {"enum": ["in_progress", "finalizing", "completed", "failed",
                                            "expired", "cancelling", "cancelled"]},
                        "output_file_id": {"type": ["string", "null"]},
                        "error_file_id": {"type": ["string", "null"]},
                        "request_counts": {"type": "object", "properties": {
                            "total": {"type": "integer"}, "completed": {"type": "integer"},
                            "failed": {"type": "integer"}}}}}
CREATE_BODY = {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
               "properties": {"input_file_id": {"type": "string"},
                              "endpoint": {"enum": ["/v1/chat/completions", "/v1/completions",
                                                    "/v1/embeddings"]},
                              "completion_window": {"enum": ["24h"]},
                              "metadata": {"type": "object",
                                           "additionalProperties": {"type": "string"}}}}
LIST = {"type": "object", "required": ["object", "data", "has_more"],
        "properties": {"data": {"type": "array", "items": BATCH}, "has_more": {"type": "boolean"}}}
INVOKE = scope("invoke")

routes = [
    ApiRoute("/v1/batches", create, "POST", Operation(
        "Create a batch from an uploaded JSONL file; its lines run below interactive traffic",
        INVOKE, body=CREATE_BODY, response=BATCH)),
    ApiRoute("/v1/batches", list_all, "GET", Operation(
        "The caller's batches, newest first", INVOKE, response=LIST, query=(
            Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST}),
            Param("after", {"type": "string"}, "the last batch id of the previous page")))),
    ApiRoute("/v1/batches/{id}", get, "GET", Operation("One batch", INVOKE, response=BATCH)),
    ApiRoute("/v1/batches/{id}/cancel", cancel, "POST", Operation(
        "Cancel a batch: lines not started never run; finished ones stay in its output",
        INVOKE, response=BATCH)),
]
