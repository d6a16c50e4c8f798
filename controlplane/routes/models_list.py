"""OpenAI's `GET /v1/models` at the control plane: the caller tenant's model deployments,
the shared (catalogue) bases, and the caller's adapters.

The ids are the names the gateway takes as `model` (controlplane.lookups.model_names):
deployment names, and `base:adapter` for each adapter, with its base as `parent`.
Another tenant's deployments and adapters are never listed (the same tenant filter as
every read; a shared base lists no one's adapters but the caller's), and function
deployments are not models, so they are left out.
"""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.store.tables import Adapter, Deployment, Revision
from controlplane.routes.api import ApiRoute, Operation, scope
from controlplane.routes.context import app_state, require
from controlplane.store import adapters, deployments, snapshot


async def list_models(request: Request) -> Response:
    principal = require(request, "invoke")
    async with app_state(request).sessions() as session:
        rows = await deployments.list_for(session, principal.tenant_id)
        own = {d.name for d, _ in rows}
        rows += [(d, r) for d, r in await snapshot.shared_deployments(session) if d.name not in own]
        attached = await adapters.list_for(session, principal.tenant_id)
    data = [model_entry(d, revisions) for d, revisions in rows if serves_model(revisions)]
    bases = {d.id for d, _ in rows}       # a base no longer shared or gone: not callable
    data += [adapter_entry(a, base) for a, base in attached if base.id in bases]
    return JSONResponse({"object": "list", "data": data})


def serves_model(revisions: list[Revision]) -> bool:
    return any(deployments.kind_of(r) == "model" for r in revisions)


def model_entry(deployment: Deployment, revisions: list[Revision]) -> dict[str, Any]:
    task = revisions[-1].engine.get("task", "generate") if revisions else "generate"
    return {"id": deployment.name, "object": "model",
            "owned_by": "thawpool" if deployment.shared else deployment.tenant_id,
            "created": int(deployment.created_at.timestamp()), "task": task}


def adapter_entry(adapter: Adapter, base: Deployment) -> dict[str, Any]:
    return {"id": f"{base.name}:{adapter.name}", "object": "model", "owned_by": adapter.tenant_id,
            "created": int(adapter.created_at.timestamp()), "task": "generate", "parent": base.name}


MODEL_LIST = {"type": "object", "required": ["object", "data"], "properties": {
    "object": {"type": "string"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["id", "object", "created", "owned_by"]}}}}

routes = [
    ApiRoute("/v1/models", list_models, "GET", Operation(
        "OpenAI model list: the caller tenant's model deployments", scope("invoke"),
        response=MODEL_LIST)),
]
