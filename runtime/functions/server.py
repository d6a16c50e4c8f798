"""One function replica: `python -m runtime.functions.server --package DIR`.

Runs a tenant's handler (spec/function_package.py) in this process, never in
the control plane or the pool. Routes: `POST /invoke` (spec/function_request.py's
body; items dynamically batched by runtime/functions/worker.py), `/health` (503
`loading`, 200 `ready`, 500 `failed` with `error`: what the pool waits on),
`/v1/models` (the served name, once ready: how the pool re-adopts a replica) and
`/stats` (what it served; tokens are 0, a function has none).

Under the pool it gets a secret like runtime.serve.server (same variables, same
`RequireSecret`), read once and dropped from the environment before the
tenant's code is imported. Resource limits (`--max-open-files`, `--memory-limit-mb`:
address space, for CPU replicas; no core files) are set, soft and hard, before
the handler is imported, so the handler cannot raise them.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Optional, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.functions.batcher import Batcher
from runtime.functions.env import through_egress
from runtime.functions.handler import Handler, HandlerError, load_handler, run_batch
from spec.function_package import MANIFEST, FunctionPackage, parse_manifest
from spec.function_request import parse_function_request
from runtime.functions.worker import FunctionWorker
from runtime.serve.server import RequireSecret, health_response, read_secret
from wire.replica_control import HEALTH_PATH, STATS_PATH, Health, HealthStatus, Stats
from wire.replica_secret import SECRET_ENV, SECRET_FILE_ENV
from wire.keepalive import REPLICA_KEEPALIVE_S
from wire.errors import ProtocolError, error_body
from wire.json_input import parse_json
from wire.request_id import RequestIdMiddleware
from wire.socket_forward import EGRESS_SOCKET_ENV

log = logging.getLogger("thawpool.function")
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class FunctionSettings:
    package: Path
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    uds: Optional[str] = None              # a unix socket in place of host and port (sandboxed: no network)
    max_open_files: Optional[int] = None
    memory_limit_mb: Optional[int] = None
    log_level: str = "warning"
    secret: Optional[str] = field(default=None, repr=False)


def parse_settings(argv: Optional[Sequence[str]] = None,
                   env: Optional[dict[str, str]] = None) -> FunctionSettings:
    p = argparse.ArgumentParser(prog="python -m runtime.functions.server")
    p.add_argument("--package", required=True, type=Path, help="folder with thawpool.toml")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--uds", default=None, help="listen on this unix socket instead of --host/--port")
    p.add_argument("--max-open-files", type=int, default=None)
    p.add_argument("--memory-limit-mb", type=int, default=None)
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    return FunctionSettings(args.package, args.served_model_name or args.package.name, args.host,
                            args.port, args.uds, args.max_open_files, args.memory_limit_mb, args.log_level,
                            read_secret(dict(os.environ) if env is None else env))


class FunctionHost:
    """The package's lifecycle (loading -> ready | failed) and, once ready, its worker."""

    def __init__(self, settings: FunctionSettings):
        self.settings = settings
        self.state = HealthStatus.LOADING           # then ready or failed
        self.error: Optional[str] = None
        self.worker: Optional[FunctionWorker] = None
        self.load_s: Optional[float] = None

    async def load(self) -> None:
        started = time.perf_counter()
        try:
            package = parse_manifest((self.settings.package / MANIFEST).read_bytes())
            handler = await asyncio.to_thread(load_handler, package, self.settings.package)
        except BaseException as exc:  # noqa: BLE001 - the tenant's import or load(): report it
            self.state, self.error = HealthStatus.FAILED, f"{type(exc).__name__}: {exc}"
            log.error("function failed to load: %s", self.error)
            if not isinstance(exc, Exception):
                raise
            return
        self.worker = _worker(package, handler)
        self.worker.start()
        self.state, self.load_s = HealthStatus.READY, time.perf_counter() - started

    def health(self) -> Health:
        timings = {"load_s": round(self.load_s, 6)} if self.load_s is not None else {}
        return Health(self.state, load_timings=timings, error=self.error)

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.stop()


# asyncio's timers fire up to a millisecond late (epoll counts whole milliseconds), so
# a batch is due that much before its deadline: no item waits longer than max_wait_ms
TIMER_SLACK_S = 0.001


def _worker(package: FunctionPackage, handler: Handler) -> FunctionWorker:
    batching = package.batching
    max_wait_s = max(0.0, batching.max_wait_ms / 1000.0 - TIMER_SLACK_S)
    return FunctionWorker(lambda inputs: run_batch(handler, inputs),
                          Batcher(batching.max_batch_size, max_wait_s))


# ---------------------------------------------------------------- routes

def _host(request: Request) -> FunctionHost:
    host: FunctionHost = request.app.state.host
    return host


def _error(status: int, message: str, *, param: Optional[str] = None,
           code: Optional[str] = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param=param, code=code), status_code=status)


async def health(request: Request) -> Response:
    host = _host(request)
    return health_response(request, host.health(), host.settings.secret)


async def models(request: Request) -> Response:
    host = _host(request)
    data = [{"id": host.settings.served_model_name, "object": "model"}] if host.state is HealthStatus.READY else []
    return JSONResponse({"object": "list", "data": data})


async def stats(request: Request) -> Response:
    host = _host(request)
    s = host.worker.stats if host.worker else None
    return JSONResponse(Stats(host.settings.served_model_name, s.requests if s else 0, 0, 0,
                              s.items if s else 0, s.batches if s else 0,
                              s.compute_s if s else 0.0).to_json())


async def invoke(request: Request) -> Response:
    host = _host(request)
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return _error(413, f"body: over {MAX_BODY_BYTES} bytes", param="body")
    try:
        parsed = parse_function_request(parse_json(raw, "body", param="body"))
        if host.worker is None:
            return _error(503, f"function is {host.state.value}", code="not_ready")
        results = await host.worker.submit(parsed.items)
    except ProtocolError as exc:
        return JSONResponse(exc.body(), status_code=exc.status)
    except HandlerError as exc:
        return _error(500, str(exc), code="function_error")
    body = parsed.answer([r.output for r in results])
    body["usage"] = {"items": len(results), "compute_s": sum(r.compute_s for r in results),
                     "batch_sizes": [r.batch_size for r in results]}
    return JSONResponse(body)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, exc.detail)


def build_app(settings: FunctionSettings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        host = FunctionHost(settings)
        app.state.host = host
        loading = asyncio.ensure_future(host.load())
        try:
            yield
        finally:
            loading.cancel()
            await host.close()

    routes = [Route(HEALTH_PATH, health, methods=["GET"]),
              Route("/v1/models", models, methods=["GET"]),
              Route(STATS_PATH, stats, methods=["GET"]),
              Route("/invoke", invoke, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error})
    if settings.secret is not None:
        app.add_middleware(RequireSecret, secret=settings.secret)
    app.add_middleware(RequestIdMiddleware)
    return app


def apply_limits(settings: FunctionSettings) -> None:
    """Soft and hard limits, before any tenant code runs (it cannot raise a hard limit)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if settings.max_open_files:
        _lower(resource.RLIMIT_NOFILE, settings.max_open_files)
    if settings.memory_limit_mb:
        _lower(resource.RLIMIT_AS, settings.memory_limit_mb * 1024 * 1024)


def _lower(which: int, limit: int) -> None:
    """Soft and hard to `limit`, or to the hard limit we were given if that is lower (an
    unprivileged process cannot raise it)."""
    _, hard = resource.getrlimit(which)
    value = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(which, (value, value))


def main(argv: Optional[Sequence[str]] = None) -> None:
    import uvicorn

    settings = parse_settings(argv)
    for name in (SECRET_ENV, SECRET_FILE_ENV):
        os.environ.pop(name, None)          # read once; the tenant's code never sees it
    if settings.secret is None:
        log.warning("no replica secret: this function server answers every caller")
    apply_limits(settings)
    egress = os.environ.pop(EGRESS_SOCKET_ENV, None)
    if egress:                              # hosts the operator granted its tenant, and only those
        through_egress(Path(egress))
    uvicorn.run(build_app(settings), host=settings.host, port=settings.port, uds=settings.uds,
                log_level=settings.log_level, timeout_graceful_shutdown=5,
                timeout_keep_alive=REPLICA_KEEPALIVE_S, access_log=False)


if __name__ == "__main__":
    main()
