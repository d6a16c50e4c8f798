"""GET /openapi.json: the API's OpenAPI document, built from this app's route table."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.routes.openapi_document import document
from controlplane.routes.api import OBJECT, PUBLIC, ApiRoute, Operation


async def openapi(request: Request) -> Response:
    return JSONResponse(document(request.app.routes))


routes = [ApiRoute("/openapi.json", openapi, "GET", Operation(
    "This document", PUBLIC, response=OBJECT))]
