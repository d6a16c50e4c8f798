"""Deployments, their revisions, the traffic split and rollback (work: controlplane.deploy.deployer)."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.deploy.deployment_spec import (MAX_TARGET_CONCURRENCY, NAME, parse_create,
                                         parse_patch)
from controlplane.deploy.fallback_spec import CONDITIONS, MAX_COLD_WAIT_S, MAX_FALLBACKS
from controlplane.store.tables import Deployment, Revision
from controlplane.fields import boolean, obj
from controlplane.routes.api import ADMIN, ApiRoute, Operation, data_of, scope, string_schema
from controlplane.routes.context import app_state, read_json, require, require_admin
from controlplane.store import deployments, tenants
from controlplane.store.errors import InvalidField
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


async def set_shared(request: Request) -> Response:
    """The operator's catalogue: `{"shared": true}` lets every tenant call the deployment
    and attach adapters to it; tenants never set it."""
    require_admin(request)
    state = app_state(request)
    body = obj("body", await read_json(request), {"shared"})
    if "shared" not in body:
        raise InvalidField("shared", "is required")
    shared = boolean("shared", body["shared"])
    async with state.sessions() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
    deployment, revisions = await state.deployer.set_shared(tenant.id, request.path_params["name"], shared)
    return JSONResponse(view(deployment, revisions))


def view(deployment: Deployment, revisions: list[Revision]) -> dict[str, Any]:
    return {
        "id": deployment.id, "name": deployment.name, "shared": deployment.shared,
        "kind": deployments.kind_of(revisions[-1]) if revisions else "model",
        "scaling": asdict(deployments.scaling_of(deployment)),
        "traffic": dict(deployment.traffic),
        "fallbacks": [f.as_json() for f in deployments.fallbacks_of(deployment)],
        "revisions": [revision_view(r) for r in revisions],
        "created_at": deployment.created_at.isoformat(),
        "updated_at": deployment.updated_at.isoformat(),
    }


def revision_view(revision: Revision) -> dict[str, Any]:
    return {
        "name": revision.name, "id": revision.id, "model_uri": revision.model_uri,
        "architecture": revision.architecture, "engine": dict(revision.engine),
        "weights": revision.weights,
        "resources": {"gpu_memory_gb": revision.gpu_memory_gb, "gpu_count": revision.gpu_count},
        "created_at": revision.created_at.isoformat(),
    }


def _status_views(pool: Pool, revisions: list[Revision]) -> dict[str, Any]:
    """Each revision's RevisionStatus as JSON-safe data (datetimes become ISO text)."""
    statuses = {r.name: asdict(pool.revision_status(r.id)) for r in revisions}
    plain: dict[str, Any] = json.loads(json.dumps(statuses, default=str))
    return plain


MODEL_URI = string_schema("^s3://", description="s3://bucket/prefix/ under a model source")
RESOURCES = {"type": "object", "additionalProperties": False, "properties": {
    "gpu_memory_gb": {"type": "number", "exclusiveMinimum": 0},
    "gpu_count": {"type": "integer", "minimum": 1}}}
SCALING = {"type": "object", "additionalProperties": False, "properties": {
    "min_replicas": {"type": "integer", "minimum": 0},
    "max_replicas": {"type": "integer", "minimum": 1},
    "target_concurrency": {"type": "integer", "minimum": 1, "maximum": MAX_TARGET_CONCURRENCY},
    "idle_timeout_s": {"type": "number", "minimum": 0},
    "sleep_timeout_s": {"type": "number", "minimum": 0, "description":
                        "after idle_timeout_s, replicas sleep this long (no GPU billed, a wake "
                        "instead of a cold start) before they stop; 0: no sleep tier"},
    "prefetch": {"type": "boolean", "description":
                 "pull the weights into the node cache on deploy and on each scale-up, before a "
                 "request needs them (status: weights_cached)"}}}
ENGINE = {"type": "object", "description": "runtime engine options; speculative.model is a "
                                           "model URI under the same sources"}
FALLBACKS = {"type": "array", "maxItems": MAX_FALLBACKS, "description":
             "other deployments of yours, in order, that take a call this one cannot answer "
             "(docs/fallbacks.md); a fallback's own fallbacks are not followed",
             "items": {"type": "object", "required": ["deployment"], "additionalProperties": False,
                       "properties": {
                           "deployment": {"type": "string", "description": "a deployment of yours"},
                           "on": {"type": "array", "minItems": 1,
                                  "items": {"enum": list(CONDITIONS)}, "description":
                                  "cold: no ready replica within cold_wait_s; rate_limited: the "
                                  "pool's 429 (GPU quota, queue); error: the replica's 5xx or "
                                  "unreachable (default: all three)"},
                           "cold_wait_s": {"type": "number", "minimum": 0,
                                           "maximum": MAX_COLD_WAIT_S}}}}
CREATE_BODY = {"type": "object", "required": ["name", "model_uri"], "additionalProperties": False,
               "properties": {"name": string_schema(NAME.pattern), "model_uri": MODEL_URI,
                              "kind": {"enum": ["model", "function"], "description":
                                       "function: model_uri is a package with thawpool.toml"},
                              "resources": RESOURCES, "scaling": SCALING, "engine": ENGINE,
                              "fallbacks": FALLBACKS}}
PATCH_BODY = {"type": "object", "additionalProperties": False, "minProperties": 1,
              "properties": {"model_uri": MODEL_URI, "resources": RESOURCES, "scaling": SCALING,
                             "engine": ENGINE, "promote": {"type": "boolean"},
                             "fallbacks": FALLBACKS}}
DEPLOYMENT = {"type": "object", "required": ["id", "name", "shared", "scaling", "traffic", "revisions"],
              "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                             "shared": {"type": "boolean", "description":
                                        "in the operator's catalogue: every tenant may call it "
                                        "and attach adapters to it"},
                             "scaling": SCALING, "traffic": {"type": "object"},
                             "fallbacks": FALLBACKS,
                             "revisions": {"type": "array", "items": {"type": "object"}}}}
SPLIT = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0,
                                                    "maximum": 100},
         "description": "percent per revision name, summing to 100: {\"r1\": 90, \"r2\": 10}"}
DEPLOY = scope("deploy")

routes = [
    ApiRoute("/v1/deployments", create, "POST", Operation(
        "Deploy a model (its first revision)", DEPLOY, ok=201, body=CREATE_BODY,
        response=DEPLOYMENT)),
    ApiRoute("/v1/deployments", list_all, "GET", Operation(
        "List the caller's deployments", DEPLOY, response=data_of(DEPLOYMENT))),
    ApiRoute("/v1/deployments/{name}", get, "GET", Operation(
        "A deployment and the pool's status of each revision", DEPLOY, response=DEPLOYMENT)),
    ApiRoute("/v1/deployments/{name}", patch, "PATCH", Operation(
        "Change scaling in place, or anything else as a new revision", DEPLOY,
        body=PATCH_BODY, response=DEPLOYMENT)),
    ApiRoute("/v1/deployments/{name}", delete, "DELETE", Operation(
        "Delete a deployment", DEPLOY, ok=204)),
    ApiRoute("/v1/deployments/{name}/traffic", set_traffic, "POST", Operation(
        "Split traffic between revisions", DEPLOY, body=SPLIT, response=DEPLOYMENT)),
    ApiRoute("/v1/deployments/{name}/rollback", rollback, "POST", Operation(
        "All traffic to the revision before the newest live one", DEPLOY,
        response=DEPLOYMENT)),
    ApiRoute("/v1/tenants/{tenant}/deployments/{name}", set_shared, "PATCH", Operation(
        "Share a tenant's deployment with every tenant (the catalogue), or stop", ADMIN,
        body={"type": "object", "required": ["shared"], "additionalProperties": False,
              "properties": {"shared": {"type": "boolean"}}}, response=DEPLOYMENT)),
]
