"""The OpenAI Files API for batches: POST /v1/files (multipart, purpose "batch"),
GET /v1/files, GET/DELETE /v1/files/{id}, GET /v1/files/{id}/content (work:
controlplane.batch.files). A tenant reaches only its own files (404 for another's)."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.routes.api import ApiRoute, Operation, Param, data_of, scope
from controlplane.routes.context import app_state, read_body, require
from controlplane.routes.multipart import parse_form
from controlplane.store.tables import BatchFile
from wire.errors import ProtocolError

FORM_OVERHEAD = 64 * 1024       # the multipart framing around the file
MAX_LIST = 10_000


async def create(request: Request) -> Response:
    principal = require(request, "invoke")
    state = app_state(request)
    raw = await read_body(request, state.settings.batch_file_max_bytes + FORM_OVERHEAD)
    form = parse_form(request.headers.get("content-type", ""), raw)
    if "file" not in form:
        raise ProtocolError("file: is required", param="file")
    purpose = form["purpose"].data.decode(errors="replace") if "purpose" in form else ""
    row = await state.batch_files.upload(principal.tenant_id, form["file"].filename or "file.jsonl",
                                         purpose, form["file"].data)
    return JSONResponse(view(row))


async def list_all(request: Request) -> Response:
    principal = require(request, "invoke")
    purpose = request.query_params.get("purpose")
    rows = await app_state(request).batch_files.list(principal.tenant_id, purpose, _limit(request))
    return JSONResponse({"object": "list", "data": [view(r) for r in rows], "has_more": False})


async def get(request: Request) -> Response:
    principal = require(request, "invoke")
    row = await app_state(request).batch_files.get(principal.tenant_id, request.path_params["id"])
    return JSONResponse(view(row))


async def content(request: Request) -> Response:
    principal = require(request, "invoke")
    data = await app_state(request).batch_files.content(principal.tenant_id,
                                                        request.path_params["id"])
    return Response(data, media_type="application/octet-stream")


async def delete(request: Request) -> Response:
    principal = require(request, "invoke")
    file_id = request.path_params["id"]
    await app_state(request).batch_files.delete(principal.tenant_id, file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", str(MAX_LIST))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST:
        raise ProtocolError(f"limit: an integer from 1 to {MAX_LIST}", param="limit")
    return int(raw)


def view(row: BatchFile) -> dict[str, Any]:
    """OpenAI's file object; never the object key."""
    return {"id": row.id, "object": "file", "bytes": row.bytes,
            "created_at": int(row.created_at.timestamp()), "filename": row.filename,
            "purpose": row.purpose, "status": "processed"}


FILE = {"type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
        "properties": {"id": {"type": "string"}, "object": {"enum": ["file"]},
                       "bytes": {"type": "integer"}, "created_at": {"type": "integer"},
                       "filename": {"type": "string"},
                       "purpose": {"enum": ["batch", "batch_output"]}}}
UPLOAD = {"type": "object", "required": ["file", "purpose"], "properties": {
    "file": {"type": "string", "format": "binary"}, "purpose": {"enum": ["batch"]}}}
DELETED = {"type": "object", "required": ["id", "deleted"],
           "properties": {"id": {"type": "string"}, "deleted": {"type": "boolean"}}}
INVOKE = scope("invoke")

routes = [
    ApiRoute("/v1/files", create, "POST", Operation(
        "Upload a JSONL batch input file (multipart/form-data: file, purpose=batch)", INVOKE,
        body=UPLOAD, response=FILE, body_media_type="multipart/form-data")),
    ApiRoute("/v1/files", list_all, "GET", Operation(
        "The caller's files, newest first", INVOKE, response=data_of(FILE), query=(
            Param("purpose", {"type": "string"}, "only files of this purpose"),
            Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST})))),
    ApiRoute("/v1/files/{id}", get, "GET", Operation("One file", INVOKE, response=FILE)),
    ApiRoute("/v1/files/{id}/content", content, "GET", Operation(
        "A file's bytes (a batch's output and error files are JSONL)", INVOKE,
        response={"type": "string", "format": "binary"}, media_type="application/octet-stream")),
    ApiRoute("/v1/files/{id}", delete, "DELETE", Operation(
        "Delete a file", INVOKE, response=DELETED)),
]
