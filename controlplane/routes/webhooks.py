"""Webhook endpoints (controlplane.webhooks): a tenant registers its own, the operator
any tenant's or the platform's.

`POST /v1/webhooks {"url", "event_types": ["budget.threshold"] | ["*"], "enabled",
"description", "tenant" (the operator only; none: every event)}` answers the endpoint
with its signing `secret`, shown this once. `GET /v1/webhooks[?tenant=]`,
`GET|PATCH|DELETE /v1/webhooks/{id}` (PATCH: url, event_types, enabled, description),
`GET /v1/webhooks/{id}/deliveries?limit=` (newest first, each with its attempts) and
`POST /v1/webhooks/{id}/test` (a `webhook.test` event to that endpoint alone; 409 when it
is disabled). A tenant sees only its own endpoints: another tenant's, or the
operator's, is 404.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.fields import boolean, integer, obj, text
from controlplane.routes.api import ApiRoute, Operation, Param, data_of, scope, string_schema
from controlplane.routes.context import app_state, read_json, require
from controlplane.store import tenants
from controlplane.store.errors import Conflict, Forbidden, InvalidField
from controlplane.store.tables import WebhookAttempt, WebhookEndpoint
from controlplane.store.tenants import Principal
from controlplane.webhooks import endpoints
from controlplane.webhooks.deliveries import DeliveryView, list_for_endpoint
from controlplane.webhooks.endpoints import EndpointSpec, Viewer
from controlplane.webhooks.events import EVENT_TYPES, EVERY_TYPE, TEST

FIELDS = {"url", "event_types", "enabled", "description", "tenant"}
DEFAULT_LIMIT, MAX_LIMIT = 50, 200


def viewer(principal: Principal) -> Viewer:
    return Viewer(principal.tenant_id, principal.is_admin)


async def create(request: Request) -> Response:
    principal = require(request, "deploy")
    body = obj("body", await read_json(request), FIELDS)
    state = app_state(request)
    async with state.sessions.begin() as session:
        tenant_id: Optional[str] = principal.tenant_id
        if principal.is_admin:
            tenant_id = (None if body.get("tenant") is None else
                         (await tenants.find_tenant(session, text("tenant", body["tenant"]))).id)
        elif body.get("tenant") is not None:
            raise Forbidden("tenant", "only the operator registers endpoints for other tenants",
                            code="operator_only")
        row, secret = await endpoints.create(session, _spec(body, tenant_id, principal.is_admin),
                                             state.sealer)
    return JSONResponse({**endpoint_view(row), "secret": secret}, status_code=201)


def _spec(body: dict[str, Any], tenant_id: Optional[str], operator: bool) -> EndpointSpec:
    return EndpointSpec(
        url=endpoints.check_url(body.get("url")),
        event_types=endpoints.check_event_types(body.get("event_types")),
        enabled=boolean("enabled", body.get("enabled", True)),
        description=_description(body.get("description")),
        tenant_id=tenant_id, operator=operator)


async def list_endpoints(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        tenant_id = None
        if request.query_params.get("tenant") is not None:
            if not principal.is_admin:
                raise Forbidden("tenant", "only the operator lists other tenants' endpoints",
                                code="operator_only")
            tenant_id = (await tenants.find_tenant(session, request.query_params["tenant"])).id
        rows = await endpoints.list_for(session, viewer(principal), tenant_id)
    return JSONResponse({"data": [endpoint_view(r) for r in rows]})


async def get(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        row = await endpoints.get(session, viewer(principal), request.path_params["id"])
    return JSONResponse(endpoint_view(row))


async def update(request: Request) -> Response:
    """Any of url, event_types, enabled, description; the rest stays."""
    principal = require(request, "deploy")
    body = obj("body", await read_json(request), FIELDS - {"tenant"})
    changes = {name: CHECKS[name](value) for name, value in body.items()}
    async with app_state(request).sessions.begin() as session:
        row = await endpoints.update(session, viewer(principal), request.path_params["id"], changes)
    return JSONResponse(endpoint_view(row))


def _description(value: Any) -> Optional[str]:
    return None if value is None else text("description", value, 500)


CHECKS = {"url": endpoints.check_url, "event_types": endpoints.check_event_types,
          "enabled": lambda value: boolean("enabled", value), "description": _description}


async def delete(request: Request) -> Response:
    principal = require(request, "deploy")
    async with app_state(request).sessions.begin() as session:
        await endpoints.delete(session, viewer(principal), request.path_params["id"])
    return Response(status_code=204)


async def deliveries(request: Request) -> Response:
    principal = require(request, "deploy")
    limit = _limit(request.query_params.get("limit"))
    async with app_state(request).sessions() as session:
        row = await endpoints.get(session, viewer(principal), request.path_params["id"])
        views = await list_for_endpoint(session, row.id, limit)
    return JSONResponse({"data": [delivery_view(v) for v in views]})


async def test(request: Request) -> Response:
    """Queued now and delivered by the worker like any event, so the ping's attempts show
    in the endpoint's deliveries."""
    principal = require(request, "deploy")
    state = app_state(request)
    async with state.sessions() as session:
        row = await endpoints.get(session, viewer(principal), request.path_params["id"])
    if not row.enabled:
        raise Conflict("webhook_disabled", "the endpoint is disabled: enable it to test it")
    published, delivery_id = await state.webhooks.ping(row)
    return JSONResponse({"event_id": published.event_id, "delivery_id": delivery_id},
                        status_code=202)


def _limit(value: Optional[str]) -> int:
    if value is None:
        return DEFAULT_LIMIT
    if not value.isdigit():
        raise InvalidField("limit", "must be an integer")
    return integer("limit", int(value), 1, MAX_LIMIT)


def endpoint_view(row: WebhookEndpoint) -> dict[str, Any]:
    """Never the secret (it is shown once, by create)."""
    return {"id": row.id, "url": row.url, "event_types": row.event_types, "enabled": row.enabled,
            "description": row.description, "tenant_id": row.tenant_id, "operator": row.operator,
            "created_at": row.created_at.isoformat()}


def delivery_view(view: DeliveryView) -> dict[str, Any]:
    d = view.delivery
    return {"id": d.id, "event_id": d.event_id, "event_type": view.event_type,
            "status": d.status, "attempts": d.attempts,
            "next_attempt_at": _iso(d.next_attempt_at), "last_status_code": d.last_status_code,
            "last_error": d.last_error, "created_at": d.created_at.isoformat(),
            "completed_at": _iso(d.completed_at),
            "attempt_log": [_attempt_view(a) for a in view.attempts]}


def _attempt_view(a: WebhookAttempt) -> dict[str, Any]:
    return {"number": a.number, "started_at": a.started_at.isoformat(),
            "duration_ms": round(a.duration_ms, 3), "status_code": a.status_code,
            "error": a.error}


def _iso(value: Optional[datetime]) -> Optional[str]:
    return None if value is None else value.isoformat()


NULLABLE_TEXT = {"type": ["string", "null"]}
TYPES = {"type": "array", "minItems": 1,
         "items": {"enum": sorted(EVENT_TYPES - {TEST}) + [EVERY_TYPE]}}
ENDPOINT_PROPERTIES = {
    "id": {"type": "string"}, "url": {"type": "string"}, "event_types": TYPES,
    "enabled": {"type": "boolean"}, "description": NULLABLE_TEXT, "tenant_id": NULLABLE_TEXT,
    "operator": {"type": "boolean"}, "created_at": string_schema(format="date-time")}
ENDPOINT = {"type": "object", "required": sorted(ENDPOINT_PROPERTIES),
            "properties": ENDPOINT_PROPERTIES}
CREATED = {"type": "object", "required": [*sorted(ENDPOINT_PROPERTIES), "secret"],
           "properties": {**ENDPOINT_PROPERTIES, "secret": string_schema(
               "^whsec_", description="signs every delivery; shown this once")}}
CHANGEABLE = {"url": string_schema("^https?://"), "event_types": TYPES,
              "enabled": {"type": "boolean"}, "description": NULLABLE_TEXT}
CREATE_BODY = {"type": "object", "required": ["url", "event_types"], "additionalProperties": False,
               "properties": {**CHANGEABLE, "tenant": NULLABLE_TEXT}}
UPDATE_BODY = {"type": "object", "additionalProperties": False, "properties": CHANGEABLE}
ATTEMPT = {"type": "object", "required": ["number", "started_at", "duration_ms", "status_code",
                                          "error"],
           "properties": {"number": {"type": "integer"}, "duration_ms": {"type": "number"},
                          "status_code": {"type": ["integer", "null"]}, "error": NULLABLE_TEXT}}
DELIVERY = {"type": "object", "required": ["id", "event_id", "event_type", "status", "attempts",
                                           "attempt_log"],
            "properties": {"id": {"type": "string"}, "event_id": {"type": "string"},
                           "event_type": {"type": "string"},
                           "status": {"enum": ["pending", "succeeded", "failed"]},
                           "attempts": {"type": "integer"},
                           "attempt_log": {"type": "array", "items": ATTEMPT}}}
PING = {"type": "object", "required": ["event_id", "delivery_id"],
        "properties": {"event_id": {"type": "string"}, "delivery_id": {"type": "string"}}}
DEPLOY = scope("deploy")

routes = [
    ApiRoute("/v1/webhooks", create, "POST", Operation(
        "Register a webhook endpoint (its secret is shown once)", DEPLOY, ok=201,
        body=CREATE_BODY, response=CREATED)),
    ApiRoute("/v1/webhooks", list_endpoints, "GET", Operation(
        "The caller's webhook endpoints (the operator: every one)", DEPLOY,
        query=(Param("tenant", string_schema(), "the operator: this tenant's only"),),
        response=data_of(ENDPOINT))),
    ApiRoute("/v1/webhooks/{id}", get, "GET", Operation(
        "One webhook endpoint", DEPLOY, response=ENDPOINT)),
    ApiRoute("/v1/webhooks/{id}", update, "PATCH", Operation(
        "Change an endpoint's URL, event types, enabled or description", DEPLOY,
        body=UPDATE_BODY, response=ENDPOINT)),
    ApiRoute("/v1/webhooks/{id}", delete, "DELETE", Operation(
        "Delete a webhook endpoint and its pending deliveries", DEPLOY, ok=204)),
    ApiRoute("/v1/webhooks/{id}/deliveries", deliveries, "GET", Operation(
        "An endpoint's latest deliveries, with every attempt", DEPLOY,
        query=(Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),),
        response=data_of(DELIVERY))),
    ApiRoute("/v1/webhooks/{id}/test", test, "POST", Operation(
        "Send a webhook.test event to this endpoint", DEPLOY, ok=202, response=PING)),
]
