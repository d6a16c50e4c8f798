"""A tenant's LoRA adapters: attach one to a base deployment, list, read, delete (work:
controlplane.deploy.adapters). Another tenant's adapter is 404 on every route."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.deploy.adapter_spec import parse_attach
from controlplane.deploy.deployment_spec import NAME
from controlplane.routes.api import ApiRoute, Operation, scope, string_schema
from controlplane.routes.context import app_state, read_json, require
from controlplane.store import adapters
from controlplane.store.tables import Adapter, Deployment


async def create(request: Request) -> Response:
    principal = require(request, "deploy")
    spec = parse_attach(await read_json(request))
    adapter, base = await app_state(request).attacher.attach(principal.tenant_id, spec)
    return JSONResponse(view(adapter, base), status_code=201)


async def list_all(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        rows = await adapters.list_for(session, principal.tenant_id)
    return JSONResponse({"object": "list", "data": [view(a, b) for a, b in rows]})


async def get(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        adapter, base = await adapters.find(session, principal.tenant_id, request.path_params["name"])
    return JSONResponse(view(adapter, base))


async def delete(request: Request) -> Response:
    principal = require(request, "deploy")
    adapter, _ = await app_state(request).attacher.detach(principal.tenant_id,
                                                          request.path_params["name"])
    return JSONResponse({"id": adapter.id, "name": adapter.name, "deleted": True})


def view(adapter: Adapter, base: Deployment) -> dict[str, Any]:
    """`model` is what a call names it by (its own name works too)."""
    return {"id": adapter.id, "name": adapter.name, "base": base.name, "base_shared": base.shared,
            "model": f"{base.name}:{adapter.name}", "adapter_uri": adapter.adapter_uri,
            "rank": adapter.rank, "target_modules": list(adapter.target_modules),
            "weight_bytes": adapter.weight_bytes, "created_at": adapter.created_at.isoformat()}


NAME_SCHEMA = string_schema(NAME.pattern)
CREATE_BODY = {"type": "object", "required": ["name", "base", "adapter_uri"], "additionalProperties": False,
               "properties": {
                   "name": NAME_SCHEMA,
                   "base": string_schema(NAME.pattern, description="a deployment of yours, or a "
                                         "shared one, with engine max_loras set"),
                   "adapter_uri": string_schema("^s3://", description=(
                       "s3://bucket/prefix/ holding adapter_config.json and "
                       "adapter_model.safetensors (PEFT), under a model source of yours"))}}
ADAPTER = {"type": "object",
           "required": ["id", "name", "base", "base_shared", "model", "adapter_uri", "rank",
                        "target_modules", "weight_bytes", "created_at"],
           "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                          "base": {"type": "string"}, "base_shared": {"type": "boolean"},
                          "model": {"type": "string", "description": "base:name, as a call names it"},
                          "adapter_uri": {"type": "string"}, "rank": {"type": "integer"},
                          "target_modules": {"type": "array", "items": {"type": "string"}},
                          "weight_bytes": {"type": "integer"}, "created_at": {"type": "string"}}}
ADAPTERS = {"type": "object", "required": ["object", "data"],
            "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ADAPTER}}}
DELETED = {"type": "object", "required": ["id", "name", "deleted"],
           "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                          "deleted": {"const": True}}}
DEPLOY = scope("deploy")

routes = [
    ApiRoute("/v1/adapters", create, "POST", Operation(
        "Attach a LoRA adapter (a PEFT folder in S3) to a base deployment", DEPLOY, ok=201,
        body=CREATE_BODY, response=ADAPTER)),
    ApiRoute("/v1/adapters", list_all, "GET", Operation(
        "List the caller's adapters", DEPLOY, response=ADAPTERS)),
    ApiRoute("/v1/adapters/{name}", get, "GET", Operation(
        "An adapter of the caller's", DEPLOY, response=ADAPTER)),
    ApiRoute("/v1/adapters/{name}", delete, "DELETE", Operation(
        "Delete an adapter (its name is free again)", DEPLOY, response=DELETED)),
]
