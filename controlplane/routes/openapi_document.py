"""The OpenAPI 3.1 document of the whole API, built from the app's route table.

Every route must be a `routes.api.ApiRoute` (a TypeError names one that is
not), so a route cannot be added without its documentation. Every operation
documents its success answer and, in one shape (`Error`), every refusal.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from starlette.routing import BaseRoute

from controlplane.routes.api import ApiRoute, JsonSchema, Operation

ERROR: JsonSchema = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "additionalProperties": False,
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}}}}}
REFUSALS = {"4XX": "Refused: bad input (400), auth (401/403), not found (404), conflict "
                   "(409), too large (413), invalid field or quota (422), rate limit (429)",
            "503": "Unavailable for now; Retry-After says when to try again"}
PATH_PARAM = re.compile(r"\{([^}:]+)(?::[^}]+)?\}")


def document(routes: Iterable[BaseRoute], *, title: str = "thawpool",
             version: str = "1") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, ApiRoute):
            raise TypeError(f"route {getattr(route, 'path', route)!r} is not an ApiRoute: "
                            "document it (controlplane.routes.api)")
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {"openapi": "3.1.0", "info": {"title": title, "version": version},
            "paths": paths,
            "components": {"schemas": {"Error": ERROR},
                           "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"},
                                               "metricsToken": {"type": "http",
                                                                "scheme": "bearer"}}}}


def _operation(route: ApiRoute) -> dict[str, Any]:
    op = route.operation
    doc: dict[str, Any] = {
        "operationId": f"{route.method.lower()}_{route.endpoint.__module__.rsplit('.', 1)[-1]}"
                       f"_{route.endpoint.__name__}",
        "summary": op.summary, "description": _who(op),
        "parameters": _parameters(route), "responses": _responses(op)}
    if op.access.kind in ("scope", "admin"):
        doc["security"] = [{"apiKey": []}]
    elif op.access.kind == "metrics":
        doc["security"] = [{"metricsToken": []}]
    if op.body is not None:
        doc["requestBody"] = {"required": True,
                              "content": {op.body_media_type: {"schema": op.body}}}
    return doc


def _who(op: Operation) -> str:
    return {"public": "Anyone.", "metrics": "The holder of the metrics token.",
            "admin": "An admin key (the operator's tenant)."}.get(
        op.access.kind, f"A key with the `{op.access.scope}` scope (admin keys hold every scope).")


def _parameters(route: ApiRoute) -> list[dict[str, Any]]:
    params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
              for name in PATH_PARAM.findall(route.path)]
    return params + [{"name": p.name, "in": "query", "required": False, "schema": p.schema,
                      "description": p.description} for p in route.operation.query]


def _responses(op: Operation) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": "OK"}
    if op.response is not None:
        answer["content"] = {op.media_type: {"schema": op.response}}
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {str(op.ok): answer,
            **{status: {"description": text, **error} for status, text in REFUSALS.items()}}
