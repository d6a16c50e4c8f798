"""Deployments, their revisions, the traffic split and rollback (work: controlplane.deployer)."""
from __future__ import annotations

import json
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane.deployment_spec import parse_create, parse_patch
from controlplane.models import Deployment, Revision
from controlplane.pricing import PRICE_QUANTUM
from controlplane.routes.context import app_state, read_json, require
from controlplane.store import deployments
from pool.api import Pool


async def create(request: Request) -> Response:
    principal = require(request, "deploy")
    spec = parse_create(await read_json(request))
    deployment, revisions = await app_state(request).deployer.create(principal.tenant_id, spec)
    return JSONResponse(view(deployment, revisions), status_code=201)


async def list_all(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        rows = await deployments.list_for(session, principal.tenant_id)
    return JSONResponse({"data": [view(d, r) for d, r in rows]})


async def get(request: Request) -> Response:
    """The deployment, and what the pool says of each revision."""
    principal = require(request, "deploy")
    state = app_state(request)
    async with state.sessions() as session:
        deployment, revisions = await deployments.find_with_revisions(
            session, principal.tenant_id, request.path_params["name"])
    return JSONResponse({**view(deployment, revisions),
                         "status": _status_views(state.pool, revisions)})


async def patch(request: Request) -> Response:
    principal = require(request, "deploy")
    change = parse_patch(await read_json(request))
    deployment, revisions = await app_state(request).deployer.patch(
        principal.tenant_id, request.path_params["name"], change)
    return JSONResponse(view(deployment, revisions))


async def delete(request: Request) -> Response:
    principal = require(request, "deploy")
    await app_state(request).deployer.delete(principal.tenant_id, request.path_params["name"])
    return Response(status_code=204)


async def set_traffic(request: Request) -> Response:
    principal = require(request, "deploy")
    split = await read_json(request)
    deployment, revisions = await app_state(request).deployer.set_traffic(
        principal.tenant_id, request.path_params["name"], split)
    return JSONResponse(view(deployment, revisions))


async def rollback(request: Request) -> Response:
    """One call: all traffic to the revision before the newest one taking traffic."""
    principal = require(request, "deploy")
    deployment, revisions = await app_state(request).deployer.rollback(
        principal.tenant_id, request.path_params["name"])
    return JSONResponse(view(deployment, revisions))


def view(deployment: Deployment, revisions: list[Revision]) -> dict[str, Any]:
    return {
        "id": deployment.id, "name": deployment.name,
        "scaling": asdict(deployments.scaling_of(deployment)),
        "traffic": dict(deployment.traffic),
        "revisions": [revision_view(r) for r in revisions],
        "created_at": deployment.created_at.isoformat(),
        "updated_at": deployment.updated_at.isoformat(),
    }


def revision_view(revision: Revision) -> dict[str, Any]:
    return {
        "name": revision.name, "id": revision.id, "model_uri": revision.model_uri,
        "architecture": revision.architecture, "engine": dict(revision.engine),
        "resources": {"gpu_memory_gb": revision.gpu_memory_gb, "gpu_count": revision.gpu_count},
        "pricing": {k: str(Decimal(v).quantize(PRICE_QUANTUM))
                    for k, v in asdict(deployments.pricing_of(revision)).items()},
        "created_at": revision.created_at.isoformat(),
    }


def _status_views(pool: Pool, revisions: list[Revision]) -> dict[str, Any]:
    """Each revision's RevisionStatus as JSON-safe data (datetimes become ISO text)."""
    statuses = {r.name: asdict(pool.revision_status(r.id)) for r in revisions}
    plain: dict[str, Any] = json.loads(json.dumps(statuses, default=str))
    return plain


routes = [
    Route("/v1/deployments", create, methods=["POST"]),
    Route("/v1/deployments", list_all, methods=["GET"]),
    Route("/v1/deployments/{name}", get, methods=["GET"]),
    Route("/v1/deployments/{name}", patch, methods=["PATCH"]),
    Route("/v1/deployments/{name}", delete, methods=["DELETE"]),
    Route("/v1/deployments/{name}/traffic", set_traffic, methods=["POST"]),
    Route("/v1/deployments/{name}/rollback", rollback, methods=["POST"]),
]
