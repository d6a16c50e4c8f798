"""/healthz (the process answers), /readyz (Postgres and the usage writer work), /metrics.

/metrics on the public listener needs the metrics token (`Authorization: Bearer
<settings.metrics_token>`; 401 without it, or when none is set) and shows only
the platform's series, never a tenant's name; `internal_routes` serve every
series, tenants' included, on the internal listener (controlplane.app.create_metrics_app).
"""
from __future__ import annotations

import hmac

from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane.errors import ApiError
from controlplane.routes.api import METRICS, PUBLIC, ApiRoute, Operation, string_schema
from controlplane.routes.context import app_state


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    state = app_state(request)
    checks = {"usage_writer": state.writer.healthy}
    try:
        async with state.db_engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        checks["database"] = True
    except Exception:  # noqa: BLE001 - any failure means not ready
        checks["database"] = False
    ready = all(checks.values())
    return JSONResponse({"status": "ready" if ready else "not_ready", "checks": checks,
                         "outbox_depth": state.writer.outbox.depth, "sandbox": state.pool.sandbox},
                        status_code=200 if ready else 503,
                        headers={} if ready else {"Retry-After": "5"})


async def metrics(request: Request) -> Response:
    """The platform's series, for the holder of the metrics token."""
    state = app_state(request)
    expected = state.settings.metrics_token
    kind, _, given = request.headers.get("authorization", "").partition(" ")
    if not expected or kind.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), expected.encode()):
        raise ApiError(401, "metrics need the metrics token (Authorization: Bearer <token>) "
                            "or the internal metrics listener", code="invalid_metrics_token")
    return state.metrics.render(with_tenants=False)


async def internal_metrics(request: Request) -> Response:
    return app_state(request).metrics.render(with_tenants=True)


STATUS = {"type": "object", "required": ["status"], "properties": {"status": string_schema()}}

routes = [
    ApiRoute("/healthz", healthz, "GET", Operation("The process answers", PUBLIC,
                                                   response=STATUS)),
    ApiRoute("/readyz", readyz, "GET", Operation("Postgres and the usage writer work", PUBLIC,
                                                 response=STATUS)),
    ApiRoute("/metrics", metrics, "GET", Operation(
        "Platform metrics (Prometheus text; no tenant names)", METRICS,
        response=string_schema(), media_type="text/plain")),
]
internal_routes = [Route("/metrics", internal_metrics)]
