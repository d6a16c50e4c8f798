"""Model uploads to the caller's own prefix through presigned multipart URLs
(work: controlplane.deploy.uploads)."""
from __future__ import annotations

from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.store.tables import ModelUpload
from controlplane.routes.api import ApiRoute, Operation, data_of, scope, string_schema
from controlplane.routes.context import app_state, read_json, require
from controlplane.store import uploads
from controlplane.deploy.upload_spec import MAX_FILES, UPLOAD_NAME, parse_completion, parse_upload
from controlplane.deploy.uploads import PartUrls


async def create(request: Request) -> Response:
    """`{"name", "files": [{"path", "size"}]}` -> the upload with a URL to PUT each part to."""
    principal = require(request, "deploy")
    state = app_state(request)
    spec = parse_upload(await read_json(request), state.settings.upload_max_file_bytes)
    upload, urls = await state.uploads.create(principal.tenant_id, spec)
    return JSONResponse(view(request, upload, urls), status_code=201)


async def list_all(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        rows = await uploads.list_for(session, principal.tenant_id)
    return JSONResponse({"data": [view(request, u) for u in rows]})


async def get(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        upload = await uploads.find(session, principal.tenant_id, request.path_params["id"])
    return JSONResponse(view(request, upload))


async def complete(request: Request) -> Response:
    """`{"files": [{"path", "parts": [{"part_number", "etag"}]}]}`: the ETags S3 gave back."""
    principal = require(request, "deploy")
    parts = parse_completion(await read_json(request))
    upload = await app_state(request).uploads.complete(principal.tenant_id,
                                                       request.path_params["id"], parts)
    return JSONResponse(view(request, upload))


async def delete(request: Request) -> Response:
    principal = require(request, "deploy")
    await app_state(request).uploads.delete(principal.tenant_id, request.path_params["id"])
    return Response(status_code=204)


def view(request: Request, upload: ModelUpload,
         urls: Optional[PartUrls] = None) -> dict[str, Any]:
    """What the tenant sees: never the object keys or S3's upload ids."""
    def file_view(entry: dict[str, Any]) -> dict[str, Any]:
        shown = {k: entry[k] for k in ("path", "size", "part_size", "part_count", "completed")}
        if urls is not None:
            shown["parts"] = [{"part_number": n, "url": url}
                              for n, url in enumerate(urls[entry["path"]], 1)]
        return shown

    return {"id": upload.id, "name": upload.name, "status": upload.status,
            "model_uri": app_state(request).uploads.model_uri(upload),
            "total_bytes": upload.total_bytes, "files": [file_view(f) for f in upload.files],
            "created_at": upload.created_at.isoformat(),
            "expires_at": upload.expires_at.isoformat(),
            "completed_at": upload.completed_at.isoformat() if upload.completed_at else None}


FILES = {"type": "array", "minItems": 1, "maxItems": MAX_FILES}
CREATE_BODY = {"type": "object", "required": ["name", "files"], "additionalProperties": False,
               "properties": {"name": string_schema(UPLOAD_NAME.pattern), "files": {
                   **FILES, "items": {"type": "object", "required": ["path", "size"],
                                      "additionalProperties": False,
                                      "properties": {"path": string_schema(),
                                                     "size": {"type": "integer", "minimum": 1}}}}}}
COMPLETE_BODY = {"type": "object", "required": ["files"], "additionalProperties": False,
                 "properties": {"files": {**FILES, "items": {
                     "type": "object", "required": ["path", "parts"], "properties": {
                         "path": string_schema(), "parts": {"type": "array", "items": {
                             "type": "object", "required": ["part_number", "etag"],
                             "properties": {"part_number": {"type": "integer", "minimum": 1},
                                            "etag": string_schema()}}}}}}}}
UPLOAD = {"type": "object", "required": ["id", "name", "status", "model_uri", "files"],
          "properties": {"id": {"type": "string"}, "model_uri": {"type": "string"},
                         "status": {"enum": ["pending", "complete"]},
                         "files": {"type": "array", "items": {"type": "object"}}}}
DEPLOY = scope("deploy")

routes = [
    ApiRoute("/v1/models/uploads", create, "POST", Operation(
        "Start uploading a model folder to the caller's prefix (presigned part URLs)", DEPLOY,
        ok=201, body=CREATE_BODY, response=UPLOAD)),
    ApiRoute("/v1/models/uploads", list_all, "GET", Operation(
        "The caller's uploads", DEPLOY, response=data_of(UPLOAD))),
    ApiRoute("/v1/models/uploads/{id}", get, "GET", Operation(
        "One upload", DEPLOY, response=UPLOAD)),
    ApiRoute("/v1/models/uploads/{id}/complete", complete, "POST", Operation(
        "Complete an upload with the parts' ETags", DEPLOY, body=COMPLETE_BODY,
        response=UPLOAD)),
    ApiRoute("/v1/models/uploads/{id}", delete, "DELETE", Operation(
        "Abort a pending upload or delete a complete one (frees the quota)", DEPLOY, ok=204)),
]
