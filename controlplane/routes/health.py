"""/healthz (the process answers), /readyz (Postgres and the usage writer work), /metrics."""
from __future__ import annotations

from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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
                         "outbox_depth": state.writer.outbox.depth},
                        status_code=200 if ready else 503,
                        headers={} if ready else {"Retry-After": "5"})


async def metrics(request: Request) -> Response:
    return app_state(request).metrics.render()


routes = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
