"""Model sources: admins grant prefixes (to one tenant or all), tenants list theirs."""
from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.fields import obj, text
from controlplane.deploy.model_sources import check_grantable, parse_s3_uri
from controlplane.routes.api import (ADMIN, ApiRoute, Operation, Param, data_of, scope,
                                     string_schema)
from controlplane.routes.context import (app_state, read_json, require, require_admin,
                                         tenant_in_query)
from controlplane.store import model_sources, tenants
from controlplane.store.errors import InvalidField
from controlplane.store.model_sources import Grant
from pool.api import S3Access

CREDENTIALS = "credentials"


async def grant(request: Request) -> Response:
    """`{"prefix": "s3://bucket/path/", "tenant": "acme"}`; no tenant: every tenant.
    With `credentials` (one tenant only) the bucket is the tenant's own, read with them."""
    require_admin(request)
    body = obj("body", await read_json(request), {"prefix", "tenant", CREDENTIALS})
    prefix = parse_s3_uri("prefix", body.get("prefix"), bucket_root=True)
    state = app_state(request)
    check_grantable(prefix, state.settings.models_bucket)
    access = _credentials(body.get(CREDENTIALS))
    if access is not None and body.get("tenant") is None:
        raise InvalidField(CREDENTIALS, "a bucket's own credentials are granted to one tenant")
    async with state.sessions.begin() as session:
        tenant = (await tenants.find_tenant(session, text("tenant", body["tenant"]))
                  if body.get("tenant") is not None else None)
        granted = await model_sources.grant(session, prefix, tenant, access, state.sealer)
    return JSONResponse(_grant_view(granted), status_code=201)


def _credentials(value: Any) -> Optional[S3Access]:
    if value is None:
        return None
    body = obj(CREDENTIALS, value, {"access_key_id", "secret_access_key", "endpoint_url", "region"})
    endpoint = body.get("endpoint_url")
    if endpoint is not None:
        endpoint = text(f"{CREDENTIALS}.endpoint_url", endpoint, 500)
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise InvalidField(f"{CREDENTIALS}.endpoint_url", "must look like https://host[:port]")
    region = body.get("region")
    return S3Access(text(f"{CREDENTIALS}.access_key_id", body.get("access_key_id")),
                    text(f"{CREDENTIALS}.secret_access_key", body.get("secret_access_key"), 500),
                    endpoint_url=endpoint,
                    region=text(f"{CREDENTIALS}.region", region, 64) if region is not None else None)


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
    """Never the secret: who reads with which key id, at which endpoint."""
    row = granted.row
    credentials = None if row.access_key_id is None else {
        "access_key_id": row.access_key_id, "endpoint_url": row.endpoint_url, "region": row.region}
    return {"id": row.id, "prefix": row.prefix, "tenant": granted.tenant_name,
            CREDENTIALS: credentials, "created_at": row.created_at.isoformat()}


PREFIX = string_schema("^s3://", description="s3://bucket/ or s3://bucket/path/")
NULLABLE_TEXT = {"type": ["string", "null"]}
GRANT = {"type": "object", "required": ["id", "prefix", "tenant", CREDENTIALS],
         "properties": {"id": {"type": "string"}, "prefix": {"type": "string"},
                        "tenant": NULLABLE_TEXT,
                        CREDENTIALS: {"type": ["object", "null"], "properties": {
                            "access_key_id": {"type": "string"}, "endpoint_url": NULLABLE_TEXT,
                            "region": NULLABLE_TEXT}}}}
GIVEN_CREDENTIALS = {"type": "object", "required": ["access_key_id", "secret_access_key"],
                     "additionalProperties": False,
                     "properties": {"access_key_id": {"type": "string"},
                                    "secret_access_key": {"type": "string"},
                                    "endpoint_url": {"type": "string"}, "region": {"type": "string"}}}
SOURCE = {"type": "object", "required": ["prefix", "kind"],
          "properties": {"prefix": {"type": "string"},
                         "kind": {"enum": ["own", "shared", "granted"]}}}

routes = [
    ApiRoute("/v1/model-sources", grant, "POST", Operation(
        "Grant a model source to a tenant, or to every tenant", ADMIN, ok=201,
        body={"type": "object", "required": ["prefix"], "additionalProperties": False,
              "properties": {"prefix": PREFIX, "tenant": NULLABLE_TEXT, CREDENTIALS: GIVEN_CREDENTIALS}},
        response=GRANT)),
    ApiRoute("/v1/model-sources", list_grants, "GET", Operation(
        "List model-source grants", ADMIN, query=(Param("tenant", string_schema()),),
        response=data_of(GRANT))),
    ApiRoute("/v1/model-sources/{id}", revoke, "DELETE", Operation(
        "Revoke a grant (new revisions stop reading the prefix)", ADMIN, ok=204)),
    ApiRoute("/v1/models/sources", mine, "GET", Operation(
        "The prefixes the caller may deploy from", scope("deploy"), response=data_of(SOURCE))),
]
