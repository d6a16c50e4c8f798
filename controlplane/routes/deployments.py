"""Deployments, their revisions, the traffic split and rollback."""
from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane import deployments as db
from controlplane.auth import require
from controlplane.bodies import read_json
from controlplane.deployment_spec import RevisionConfig, parse_create, parse_patch
from controlplane.errors import ApiError, invalid
from controlplane.models import utcnow
from controlplane.traffic import parse_split, rollback_target
from pool.api import ModelUnavailable, NeverFits, PoolError


async def create(request: Request) -> Response:
    principal = require(request, "deploy")
    spec = parse_create(await _body(request))
    architecture = await _inspect(request, spec.revision)
    async with request.app.state.sessions() as session, session.begin():
        deployment, revisions = await db.create(session, principal.tenant_id, spec, architecture)
        view = db.view(deployment, revisions)
    await _refresh_pool(request)
    return JSONResponse(view, status_code=201)


async def list_all(request: Request) -> Response:
    principal = require(request, "deploy")
    async with request.app.state.sessions() as session:
        rows = await db.list_for(session, principal.tenant_id)
        return JSONResponse({"data": [db.view(d, r) for d, r in rows]})


async def get(request: Request) -> Response:
    principal = require(request, "deploy")
    async with request.app.state.sessions() as session:
        deployment = await db.find(session, principal.tenant_id, request.path_params["name"])
        view = db.view(deployment, await db.revisions_of(session, deployment))
    pool = request.app.state.pool
    if hasattr(pool, "revision_status"):
        view["status"] = _status_views(pool, view["revisions"])
    return JSONResponse(view)


async def patch(request: Request) -> Response:
    principal = require(request, "deploy")
    change = parse_patch(await _body(request))
    async with request.app.state.sessions() as session:
        deployment = await db.find(session, principal.tenant_id, request.path_params["name"])
        revisions = await db.revisions_of(session, deployment)
    base = db.revision_config(revisions[-1])
    config = db.patched_config(base, change)
    architecture = await _inspect(request, config) if config != base else None
    async with request.app.state.sessions() as session, session.begin():
        deployment = await db.find(session, principal.tenant_id, request.path_params["name"],
                                   for_update=True)
        revisions = await db.revisions_of(session, deployment)
        db.apply_scaling(deployment, change)
        if config != base:
            revisions.append(db.add_revision(session, deployment, revisions, config,
                                             architecture, change.promote))
        db.touch(deployment)
        await session.flush()
        view = db.view(deployment, revisions)
    await _refresh_pool(request)
    return JSONResponse(view)


async def delete(request: Request) -> Response:
    principal = require(request, "deploy")
    async with request.app.state.sessions() as session, session.begin():
        deployment = await db.find(session, principal.tenant_id, request.path_params["name"],
                                   for_update=True)
        deployment.deleted_at = utcnow()
    await _refresh_pool(request)
    return Response(status_code=204)


async def set_traffic(request: Request) -> Response:
    principal = require(request, "deploy")
    body = await _body(request)
    return await _change_traffic(request, principal, lambda names: parse_split(body, names))


async def rollback(request: Request) -> Response:
    """One call: all traffic to the revision before the newest one taking traffic."""
    principal = require(request, "deploy")
    return await _change_traffic(request, principal, None)


async def _change_traffic(request: Request, principal, make_split) -> Response:
    async with request.app.state.sessions() as session, session.begin():
        deployment = await db.find(session, principal.tenant_id, request.path_params["name"],
                                   for_update=True)
        revisions = await db.revisions_of(session, deployment)
        names = [r.name for r in revisions]
        if make_split is None:
            split = {rollback_target(deployment.traffic, names): 100}
        else:
            split = make_split(names)
        deployment.traffic = split
        db.touch(deployment)
        await session.flush()
        view = db.view(deployment, revisions)
    await _refresh_pool(request)
    return JSONResponse(view)


async def _body(request: Request):
    return await read_json(request, request.app.state.settings.max_body_bytes)


async def _inspect(request: Request, config: RevisionConfig) -> str:
    """Reads config.json from S3 (422 naming model_uri) and asks the pool whether it fits."""
    architecture = await request.app.state.model_checker.architecture(
        config.model_uri, config.resources.gpu_count)
    pool = request.app.state.pool
    if hasattr(pool, "inspect_model") and hasattr(pool, "check_fits"):
        try:
            info = await pool.inspect_model(config.model_uri)
            pool.check_fits(info, asdict(config.resources), config.engine)
        except NeverFits as exc:
            raise invalid("resources", str(exc)) from None
        except ModelUnavailable as exc:
            raise invalid("model_uri", str(exc)) from None
        except PoolError as exc:
            raise ApiError(exc.status, str(exc), retry_after_s=exc.retry_after_s) from None
    return architecture


async def _refresh_pool(request: Request) -> None:
    refresh = getattr(request.app.state.pool, "refresh", None)
    if refresh is not None:
        await refresh()


def _status_views(pool, revisions: list[dict]) -> dict:
    out = {}
    for revision in revisions:
        status = pool.revision_status(revision["id"])
        out[revision["name"]] = _plain(status)
    return out


def _plain(value):
    """A status dataclass as JSON-safe data (datetimes become ISO text)."""
    return json.loads(json.dumps(asdict(value) if is_dataclass(value) else value, default=str))


routes = [
    Route("/v1/deployments", create, methods=["POST"]),
    Route("/v1/deployments", list_all, methods=["GET"]),
    Route("/v1/deployments/{name}", get, methods=["GET"]),
    Route("/v1/deployments/{name}", patch, methods=["PATCH"]),
    Route("/v1/deployments/{name}", delete, methods=["DELETE"]),
    Route("/v1/deployments/{name}/traffic", set_traffic, methods=["POST"]),
    Route("/v1/deployments/{name}/rollback", rollback, methods=["POST"]),
]
