"""OpenAI's `GET /v1/models` at the control plane: the caller tenant's model deployments.

The ids are the deployment names the gateway takes as `model`; another tenant's
deployments are never listed (the same tenant filter as every deployment read),
and function deployments are not models, so they are left out.
"""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.store.tables import Deployment, Revision
from controlplane.routes.api import ApiRoute, Operation, scope
from controlplane.routes.context import app_state, require
from controlplane.store import deployments


async def list_models(request: Request) -> Response:
    principal = require(request, "invoke")
    async with app_state(request).sessions() as session:
        rows = await deployments.list_for(session, principal.tenant_id)
    data = [model_entry(d, revisions) for d, revisions in rows if serves_model(revisions)]
    return JSONResponse({"object": "list", "data": data})


def serves_model(revisions: list[Revision]) -> bool:
    return any(deployments.kind_of(r) == "model" for r in revisions)


def model_entry(deployment: Deployment, revisions: list[Revision]) -> dict[str, Any]:
    task = revisions[-1].engine.get("task", "generate") if revisions else "generate"
    return {"id": deployment.name, "object": "model", "owned_by": deployment.tenant_id,
            "created": int(deployment.created_at.timestamp()), "task": task}


MODEL_LIST = {"type": "object", "required": ["object", "data"], "properties": {
    "object": {"type": "string"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["id", "object", "created", "owned_by"]}}}}

routes = [
    ApiRoute("/v1/models", list_models, "GET", Operation(
        "OpenAI model list: the caller tenant's model deployments", scope("invoke"),
        response=MODEL_LIST)),
]
