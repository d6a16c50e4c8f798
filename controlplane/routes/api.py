"""Every route of the API is an `ApiRoute`: a Starlette Route with the `Operation` that
documents it (who may call it, its body, query and answer), so `controlplane.routes.openapi_document`
builds /openapi.json from the route table and no route goes undocumented."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from starlette.routing import Route

JsonSchema = dict[str, Any]
OBJECT: JsonSchema = {"type": "object"}


@dataclass(frozen=True)
class Access:
    """Who may call: anyone (`public`), the metrics token holder (`metrics`), a key with
    `scope`, or an admin key (`admin`)."""
    kind: str
    scope: Optional[str] = None

    @property
    def needs_key(self) -> bool:
        return self.kind in ("scope", "admin")


PUBLIC = Access("public")
METRICS = Access("metrics")
ADMIN = Access("admin")


def scope(name: str) -> Access:
    return Access("scope", name)


@dataclass(frozen=True)
class Param:
    name: str
    schema: JsonSchema
    description: str = ""


@dataclass(frozen=True)
class Operation:
    summary: str
    access: Access
    ok: int = 200                              # the success status
    body: Optional[JsonSchema] = None          # the JSON body's schema, when it takes one
    query: tuple[Param, ...] = ()
    response: Optional[JsonSchema] = None      # the success body (None: no body)
    media_type: str = "application/json"
    body_media_type: str = "application/json"     # multipart/form-data for a file upload


class ApiRoute(Route):
    """A Route for one method, with its Operation."""

    def __init__(self, path: str, endpoint: Callable[..., Any], method: str,
                 operation: Operation):
        super().__init__(path, endpoint, methods=[method])
        self.method = method
        self.operation = operation


def string_schema(pattern: Optional[str] = None, **extra: Any) -> JsonSchema:
    schema: JsonSchema = {"type": "string", **extra}
    if pattern is not None:
        schema["pattern"] = pattern
    return schema


def data_of(item: JsonSchema) -> JsonSchema:
    """A list answer: {"data": [item, ...]}."""
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"type": "array", "items": item}}}
