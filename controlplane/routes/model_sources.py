"""Model sources: admins grant prefixes (to one tenant or all), tenants list theirs."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.fields import obj, text
from controlplane.model_sources import parse_s3_uri
from controlplane.routes.api import (ADMIN, ApiRoute, Operation, Param, data_of, scope,
                                     string_schema)
from controlplane.routes.context import (app_state, read_json, require, require_admin,
                                         tenant_in_query)
from controlplane.store import model_sources, tenants
from controlplane.store.model_sources import Grant


async def grant(request: Request) -> Response:
    """`{"prefix": "s3://bucket/path/", "tenant": "acme"}`; no tenant: every tenant."""
    require_admin(request)
    body = obj("body", await read_json(request), {"prefix", "tenant"})
    prefix = parse_s3_uri("prefix", body.get("prefix"), bucket_root=True)
    async with app_state(request).sessions.begin() as session:
        tenant = (await tenants.find_tenant(session, text("tenant", body["tenant"]))
                  if body.get("tenant") is not None else None)
        granted = await model_sources.grant(session, prefix, tenant)
    return JSONResponse(_grant_view(granted), status_code=201)


async def list_grants(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions() as session:
        grants = await model_sources.list_grants(session, await tenant_in_query(session, request))
    return JSONResponse({"data": [_grant_view(g) for g in grants]})


async def revoke(request: Request) -> Response:
    """New revisions stop reading the prefix; revisions already made keep running."""
    require_admin(request)
    async with app_state(request).sessions.begin() as session:
        await model_sources.revoke(session, request.path_params["id"])
    return Response(status_code=204)


async def mine(request: Request) -> Response:
    """The prefixes the caller's tenant may deploy from."""
    principal = require(request, "deploy")
    state = app_state(request)
    async with state.sessions() as session:
        tenant = await tenants.find_tenant(session, principal.tenant_id)
        sources = await model_sources.sources_for(session, tenant, state.settings.models_bucket)
    return JSONResponse({"data": [{"prefix": s.prefix, "kind": s.kind} for s in sources]})


def _grant_view(granted: Grant) -> dict[str, Any]:
    return {"id": granted.row.id, "prefix": granted.row.prefix, "tenant": granted.tenant_name,
            "created_at": granted.row.created_at.isoformat()}


PREFIX = string_schema("^s3://", description="s3://bucket/ or s3://bucket/path/")
GRANT = {"type": "object", "required": ["id", "prefix", "tenant"],
         "properties": {"id": {"type": "string"}, "prefix": {"type": "string"},
                        "tenant": {"type": ["string", "null"]}}}
SOURCE = {"type": "object", "required": ["prefix", "kind"],
          "properties": {"prefix": {"type": "string"},
                         "kind": {"enum": ["own", "shared", "granted"]}}}

routes = [
    ApiRoute("/v1/model-sources", grant, "POST", Operation(
        "Grant a model source to a tenant, or to every tenant", ADMIN, ok=201,
        body={"type": "object", "required": ["prefix"], "additionalProperties": False,
              "properties": {"prefix": PREFIX, "tenant": {"type": ["string", "null"]}}},
        response=GRANT)),
    ApiRoute("/v1/model-sources", list_grants, "GET", Operation(
        "List model-source grants", ADMIN, query=(Param("tenant", string_schema()),),
        response=data_of(GRANT))),
    ApiRoute("/v1/model-sources/{id}", revoke, "DELETE", Operation(
        "Revoke a grant (new revisions stop reading the prefix)", ADMIN, ok=204)),
    ApiRoute("/v1/models/sources", mine, "GET", Operation(
        "The prefixes the caller may deploy from", scope("deploy"), response=data_of(SOURCE))),
]
