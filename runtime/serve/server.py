"""OpenAI-compatible HTTP server for one model replica: `python -m runtime.serve.server`.

Routes: /v1/completions, /v1/chat/completions (SSE when stream=true), /v1/embeddings
(a model whose engine task is "embed"),
/v1/models, /health, /metrics, /stats (what the replica served, as JSON, for
the pool), /admin/load for a `--standby` replica (and /admin/likely, the models it will
likely load, whose tokenizers it parses ahead: runtime/serve/parsed_tokenizers.py), /sleep and /wake (the pool's
sleep tier: runtime/core/sleep_mode.py; the replica refuses requests with 503 while asleep),
and /admin/adapters (LoRA adapters loaded and unloaded by name: runtime/serve/adapters.py;
a request whose `model` names one runs with it; their weights come as the PUT's body, or
from a file of the adapter inbox, --adapter-inbox: runtime/serve/adapter_inbox.py);
the bodies of /health, /stats, /admin/load, /admin/likely, /sleep, /wake and /admin/adapters are
wire/replica_control.py's.
This module is the settings (parsed once, in `main`) and thin routes: a
completion is parsed by wire's rules and handed to the loaded model's
`OpenAIServing` (runtime/serve/completions.py), where the rest of its path is.
Everything stateful (the `ModelHost`: the model, its serving object, the
metrics registry) is created in the lifespan and lives on `app.state`; the model's
engine steps in an engine-core process the ModelHost starts (runtime/serve/engine_core.py).

Under the pool a replica has a secret, given in its environment
(THAWPOOL_REPLICA_SECRET) or in a file only its owner may read
(THAWPOOL_REPLICA_SECRET_FILE), never on the command line; every request but
/health must then carry `Authorization: Bearer <secret>` (`RequireSecret`), and
/health without it says only whether the replica is ready (`health_response`).
Without one the server is open, like `vllm serve`, and says so at start.
"""
from __future__ import annotations

import argparse
import hmac
import logging
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterable, AsyncIterator, Mapping, Optional, Sequence, Union

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.serve.adapter_inbox import AdapterInbox
from runtime.serve.adapters import AdapterRefused, ServedAdapters, Weights
from runtime.serve.metrics import CONTENT_TYPE
from runtime.serve.model_host import ModelHost, WrongState
from spec import engine_options
from spec.lora_adapter import CONFIG_FILE, MAX_WEIGHTS_BYTES, WEIGHTS_FILE
from wire.embeddings import parse_embedding_request
from wire.keepalive import REPLICA_KEEPALIVE_S
from wire.errors import ProtocolError, error_body
from wire.json_input import parse_json
from wire.replica_control import (ADAPTER_CONFIG_HEADER, ADAPTER_FILE_HEADER, ADAPTER_INBOX_FLAG, ADAPTER_NAME,
                                  ADAPTERS_PATH, HEALTH_PATH, LIKELY_PATH, LOAD_ACCEPTED, LOAD_PATH, SLEEP_PATH,
                                  STATS_PATH, WAKE_PATH, AdapterList, AdapterReply, FreedBytes, Health, HealthStatus,
                                  LikelyModels, LoadReply, LoadRequest, SleepReply, Stats, WakeReply)
from wire.replica_secret import SECRET_ENV, SECRET_FILE_ENV
from wire.request_id import RequestIdMiddleware
from wire.requests import parse_request
from wire.sse import EventStreamResponse

log = logging.getLogger("thawpool.runtime")
OPEN_PATHS = frozenset({HEALTH_PATH})              # answered without the secret

# ---------------------------------------------------------------- settings

@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    uds: Optional[str] = None      # a unix socket in place of host and port (sandboxed: no network)
    model: Optional[str] = None
    served_model_name: Optional[str] = None
    standby: bool = False
    log_level: str = "warning"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)   # runtime.LLM kwargs given
    secret: Optional[str] = field(default=None, repr=False)       # None: open to every caller
    lora_modules: tuple[tuple[str, str], ...] = ()   # (name, PEFT folder): loaded before ready
    adapter_inbox: Optional[str] = None   # a folder a PUT may name adapter weights in; None: bodies only

    def load_request(self) -> LoadRequest:
        assert self.model is not None, "a --standby replica loads what /admin/load names"
        return LoadRequest(self.model, self.served_model_name or self.model,
                           dict(self.engine_kwargs))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runtime.serve.server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--uds", default=None, help="listen on this unix socket instead of --host/--port")
    parser.add_argument("--model", help="model folder (config.json, safetensors, tokenizer)")
    parser.add_argument("--served-model-name", help="name clients pass as `model`")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--standby", action="store_true",
                        help="start warm with no model; load one with POST /admin/load")
    parser.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=FOLDER",
                        help="PEFT adapters to load before the replica is ready (as PUT "
                             f"{ADAPTERS_PATH}/NAME would; needs --max-loras)")
    parser.add_argument(ADAPTER_INBOX_FLAG, default=None, metavar="DIR",
                        help=f"a folder whose files a PUT of {ADAPTERS_PATH}/NAME may name ({ADAPTER_FILE_HEADER}) "
                             "in place of sending the weights as its body (the pool links them there)")
    engine_options.add_flags(parser)          # one per option; the pool's engine_flags spell them
    return parser


def parse_settings(argv: Optional[Sequence[str]] = None,
                   env: Mapping[str, str] = os.environ) -> ServerSettings:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.model) == args.standby:
        parser.error("give exactly one of --model DIR or --standby")
    engine_kwargs = engine_options.from_flags(args)
    try:
        secret = read_secret(env)
        lora_modules = parse_lora_modules(args.lora_modules, engine_kwargs)
        if args.adapter_inbox is not None and not os.path.isdir(args.adapter_inbox):
            raise ValueError(f"{ADAPTER_INBOX_FLAG}: {args.adapter_inbox} is not a folder")
    except ValueError as exc:
        parser.error(str(exc))
    return ServerSettings(host=args.host, port=args.port, uds=args.uds, model=args.model,
                          served_model_name=args.served_model_name, standby=args.standby,
                          log_level=args.log_level, engine_kwargs=engine_kwargs, secret=secret,
                          lora_modules=lora_modules, adapter_inbox=args.adapter_inbox)


def parse_lora_modules(given: Sequence[str], engine_kwargs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """--lora-modules' NAME=FOLDER pairs; ValueError for a bad name, or with no adapter slots."""
    pairs = tuple((name, folder) for name, _, folder in (g.partition("=") for g in given))
    for name, folder in pairs:
        if not ADAPTER_NAME.fullmatch(name) or not folder:
            raise ValueError(f"--lora-modules: {name[:80]}={folder[:80]} is not NAME=FOLDER "
                             f"(NAME: {ADAPTER_NAME.pattern})")
    if pairs and not engine_kwargs.get("max_loras"):
        raise ValueError("--lora-modules: the engine has no adapter slots: give --max-loras")
    return pairs


def read_secret(env: Mapping[str, str]) -> Optional[str]:
    """The replica's secret from SECRET_ENV, else from the file SECRET_FILE_ENV names
    (refused unless only its owner may read it); None when neither is set."""
    if env.get(SECRET_ENV):
        return env[SECRET_ENV]
    path = env.get(SECRET_FILE_ENV)
    if not path:
        return None
    try:
        mode = os.stat(path).st_mode
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{SECRET_FILE_ENV}: cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ValueError(f"{SECRET_FILE_ENV}: {path} may be read by others; chmod 600 it")
    if not secret:
        raise ValueError(f"{SECRET_FILE_ENV}: {path} is empty")
    return secret


# ---------------------------------------------------------------- routes

def _error(status: int, message: str, param: Optional[str] = None,
           headers: Optional[Mapping[str, str]] = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param=param), status_code=status,
                        headers=headers)


def _refusal(exc: ProtocolError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer in the same JSON error shape as everything else."""
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, exc.detail, headers=exc.headers)


async def health(request: Request) -> Response:
    return health_response(request, _host(request).health(), request.app.state.secret)


def health_response(request: Request, health: Health, secret: Optional[str]) -> Response:
    """/health is open so anyone may ask whether the replica is ready; its load timings,
    model, pids and errors are for the pool, which always sends the secret."""
    told = health if secret is None or carries_secret(request.scope, f"Bearer {secret}".encode()) \
        else health.public()
    return JSONResponse(told.to_json(), status_code=health.http_status)


async def metrics(request: Request) -> Response:
    return Response(_host(request).metrics.render(), media_type=CONTENT_TYPE)


async def stats(request: Request) -> Response:
    """Requests and tokens served since the process started: the pool reads them at every
    heartbeat and as it stops the replica, to reconcile the bill."""
    host = _host(request)
    served = host.metrics.served
    return JSONResponse(Stats(host.model.served_model_name if host.model else None, served.requests,
                              served.prompt_tokens, served.completion_tokens).to_json())


async def models(request: Request) -> Response:
    """The model, once it serves (the pool re-adopts only a replica that lists it), and
    each adapter loaded on it."""
    model = _host(request).ready_model
    data = []
    if model is not None:
        base = model.served_model_name
        data.append({"id": base, "object": "model", "owned_by": "thawpool"})
        names = model.adapters.names() if model.adapters is not None else ()
        data += [{"id": name, "object": "model", "owned_by": "thawpool", "parent": base} for name in names]
    return JSONResponse({"object": "list", "data": data})


async def admin_load(request: Request) -> Response:
    host = _host(request)
    try:
        load = LoadRequest.parse(await _json_body(request), engine_options.OPTIONS)
    except ProtocolError as exc:
        return _refusal(exc)
    if not host.can_load:
        return _error(409, f"replica is {host.status.value}; it loads one model once")
    host.start_loading(load)
    return JSONResponse(LoadReply(host.status, load.served_model_name).to_json(),
                        status_code=LOAD_ACCEPTED)


async def likely_models(request: Request) -> Response:
    """A standby told the models it will likely load parses their tokenizers ahead (the
    answer lists those parsed so far, as GET does); 409 once it loads or serves one."""
    host = _host(request)
    try:
        likely = LikelyModels.parse(await _json_body(request))
    except ProtocolError as exc:
        return _refusal(exc)
    if not host.can_prepare:
        return _error(409, f"replica is {host.status.value}; only a standby prepares")
    host.prepare(likely.models)
    return JSONResponse(LikelyModels(host.tokenizers.prepared()).to_json(), status_code=LOAD_ACCEPTED)


async def prepared_models(request: Request) -> Response:
    """The likely models whose tokenizers are parsed and kept."""
    return JSONResponse(LikelyModels(_host(request).tokenizers.prepared()).to_json())


async def sleep(request: Request) -> Response:
    """Give the device back, keeping the weights in host memory; 409 unless the replica is
    ready with no request in flight."""
    try:
        freed, seconds = await _host(request).sleep()
    except WrongState as exc:
        return _error(409, str(exc))
    except Exception as exc:  # noqa: BLE001 - the host is failed now; /health says so too
        return _error(500, f"sleep failed: {type(exc).__name__}: {exc}")
    return JSONResponse(SleepReply(freed.host_bytes, seconds,
                                   FreedBytes(freed.weight_bytes, freed.kv_cache_bytes)).to_json())


async def wake(request: Request) -> Response:
    """Weights back on the device, a fresh KV cache; the stages it took (wake_timings)."""
    try:
        timings = await _host(request).wake()
    except WrongState as exc:
        return _error(409, str(exc))
    except Exception as exc:  # noqa: BLE001 - the host is failed now; /health says so too
        return _error(500, f"wake failed: {type(exc).__name__}: {exc}")
    return JSONResponse(WakeReply(timings).to_json())


async def put_adapter(request: Request) -> Response:
    """Load a LoRA adapter: ADAPTER_CONFIG_HEADER is its adapter_config.json, its
    adapter_model.safetensors the body or the inbox's file ADAPTER_FILE_HEADER names.
    Everything is refused before the weights are read that can be."""
    start = time.perf_counter()
    name = request.path_params["name"]
    try:
        adapters = _adapters(_host(request))
        _check_adapter_name(name)
        config_json = _adapter_config(request)
        weights = await _adapter_weights(request)
        await adapters.put(name, config_json, weights)
    except AdapterRefused as exc:
        return _adapter_refusal(exc)
    return JSONResponse(AdapterReply(name, True, time.perf_counter() - start).to_json(),
                        background=BackgroundTask(adapters.settle))


async def delete_adapter(request: Request) -> Response:
    name = request.path_params["name"]
    try:
        await _adapters(_host(request)).delete(name)
    except AdapterRefused as exc:
        return _adapter_refusal(exc)
    return JSONResponse(AdapterReply(name, False).to_json())


async def list_adapters(request: Request) -> Response:
    """The adapters loaded (kept while the model sleeps)."""
    model = _host(request).model
    names = model.adapters.names() if model is not None and model.adapters is not None else ()
    return JSONResponse(AdapterList(names).to_json())


def _adapters(host: ModelHost) -> ServedAdapters:
    """The ready model's adapters; AdapterRefused 503 while it loads or wakes, 409 in any
    other state or where the engine has no adapter slots."""
    if host.status in (HealthStatus.LOADING, HealthStatus.WAKING):
        raise AdapterRefused(503, f"model is not ready ({host.status.value})")
    model = host.ready_model
    if model is None:
        raise AdapterRefused(409, f"replica is {host.status.value}: adapters load into a ready model")
    if model.adapters is None:
        raise AdapterRefused(409, "max_loras: this engine has no adapter slots (max_loras is 0)",
                             param="max_loras")
    return model.adapters


def _check_adapter_name(name: str) -> None:
    if not ADAPTER_NAME.fullmatch(name):
        raise AdapterRefused(400, f"name: {name[:80]!r} is not an adapter name ({ADAPTER_NAME.pattern})",
                             param="name")


def _adapter_config(request: Request) -> bytes:
    given = request.headers.get(ADAPTER_CONFIG_HEADER)
    if not given:
        raise AdapterRefused(400, f"{ADAPTER_CONFIG_HEADER}: missing: it carries the adapter's "
                                  f"{CONFIG_FILE} (compact ASCII JSON)", param=ADAPTER_CONFIG_HEADER)
    return given.encode("latin-1")     # what the header's bytes were


async def _adapter_weights(request: Request) -> Weights:
    """The file ADAPTER_FILE_HEADER names in the inbox (the body then empty), else the body."""
    given = request.headers.get(ADAPTER_FILE_HEADER)
    if given is None:
        return await read_limited(request.stream(), request.headers.get("content-length"), MAX_WEIGHTS_BYTES)
    inbox: Optional[AdapterInbox] = request.app.state.adapter_inbox
    if inbox is None:
        raise AdapterRefused(400, f"{ADAPTER_FILE_HEADER}: this replica has no adapter inbox ({ADAPTER_INBOX_FLAG}): "
                                  f"send {WEIGHTS_FILE} as the body", param=ADAPTER_FILE_HEADER)
    if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
        raise AdapterRefused(400, f"body: must be empty where {ADAPTER_FILE_HEADER} names the weights' file",
                             param="body")
    return inbox.open(given)       # a few system calls: the pages are read as the adapter is


async def read_limited(chunks: AsyncIterable[bytes], declared: Optional[str], limit: int) -> bytearray:
    """A body of at most `limit` bytes: refused (413) on its Content-Length first, else as
    soon as more arrives, so an oversized upload is never held whole. Read into one buffer
    of the declared size (writable: the adapter reader views its tensors in place)."""
    too_large = AdapterRefused(413, f"body: {WEIGHTS_FILE} larger than {limit} bytes", param="body")
    size = int(declared) if declared is not None and declared.isdigit() else 0
    if size > limit:
        raise too_large
    body, filled = bytearray(size), 0
    async for chunk in chunks:
        end = filled + len(chunk)
        if end > limit:
            raise too_large
        body[filled:end] = chunk        # grows the buffer where no Content-Length gave its size
        filled = end
    del body[filled:]
    return body


def _adapter_refusal(exc: AdapterRefused) -> JSONResponse:
    return _error(exc.status, exc.message, param=exc.param,
                  headers={"Retry-After": "1"} if exc.status == 503 else None)


async def _json_body(request: Request) -> Any:
    """The body as JSON; ProtocolError (400) when not JSON or nested too deep."""
    return parse_json(await request.body(), "body", param="body")


async def completions(request: Request) -> Union[Response, EventStreamResponse]:
    return await _generate(request, "completions")


async def chat_completions(request: Request) -> Union[Response, EventStreamResponse]:
    return await _generate(request, "chat/completions")


async def _generate(request: Request, endpoint: str) -> Union[Response, EventStreamResponse]:
    """Parse with wire's rules and hand over to the model's OpenAIServing, which does the rest."""
    host = _host(request)
    serving = host.serving
    if serving is None:
        return _error(503, f"model is not ready ({host.status.value})",
                      headers={"Retry-After": "1"})
    if host.model is not None and host.model.embedding is not None:
        return _error(400, "model: this model serves embeddings (engine task \"embed\"): "
                           "call /v1/embeddings", param="model")
    try:
        parsed = parse_request(endpoint, await _json_body(request))
        return await serving.create(parsed, request.state.request_id, request.receive)
    except ProtocolError as exc:   # refused by wire's rules, by the model or by the engine
        return _refusal(exc)


async def embeddings(request: Request) -> Response:
    """/v1/embeddings, on a replica whose engine task is "embed"."""
    host = _host(request)
    model = host.ready_model
    if model is None:
        return _error(503, f"model is not ready ({host.status.value})",
                      headers={"Retry-After": "1"})
    serving = model.embedding
    if serving is None:
        return _error(400, "model: this model generates; deploy it with engine task \"embed\" "
                           "to serve embeddings", param="model")
    try:
        parsed = parse_embedding_request(await _json_body(request))
        return await serving.create(parsed, request.state.request_id, request.receive)
    except ProtocolError as exc:
        return _refusal(exc)


def _host(request: Request) -> ModelHost:
    host: ModelHost = request.app.state.host
    return host


class RequireSecret:
    """Every request but OPEN_PATHS carries `Authorization: Bearer <secret>`, compared in
    constant time; anything else is answered 401 in the error shape before any route."""

    def __init__(self, app: ASGIApp, secret: str):
        self.app = app
        self.expected = f"Bearer {secret}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        refusal = _error(401, "this replica needs its secret: Authorization: Bearer <secret>",
                         headers={"WWW-Authenticate": "Bearer"})
        await refusal(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        return carries_secret(scope, self.expected)


def carries_secret(scope: Scope, expected: bytes) -> bool:
    """Whether the request's Authorization header is `expected`, compared in constant time."""
    given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
    return hmac.compare_digest(given, expected)


# ---------------------------------------------------------------- app

def build_app(settings: ServerSettings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        host = ModelHost()
        app.state.host = host
        if settings.standby:
            await host.warm()   # the point of standby: torch is in memory where the engine runs
        else:
            host.start_loading(settings.load_request(), settings.lora_modules)
        try:
            yield
        finally:
            await host.close()

    routes = [
        Route(HEALTH_PATH, health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route(STATS_PATH, stats, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route(LOAD_PATH, admin_load, methods=["POST"]),
        Route(LIKELY_PATH, likely_models, methods=["POST"]),
        Route(LIKELY_PATH, prepared_models, methods=["GET"]),
        Route(SLEEP_PATH, sleep, methods=["POST"]),
        Route(WAKE_PATH, wake, methods=["POST"]),
        Route(ADAPTERS_PATH, list_adapters, methods=["GET"]),
        Route(ADAPTERS_PATH + "/{name}", put_adapter, methods=["PUT"]),
        Route(ADAPTERS_PATH + "/{name}", delete_adapter, methods=["DELETE"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error})
    app.state.secret = settings.secret      # /health tells the pool more than a stranger
    app.state.adapter_inbox = AdapterInbox(Path(settings.adapter_inbox)) if settings.adapter_inbox else None
    if settings.secret is not None:
        app.add_middleware(RequireSecret, secret=settings.secret)
    app.add_middleware(RequestIdMiddleware)          # outermost: a 401 carries the id too
    return app


def main(argv: Optional[Sequence[str]] = None) -> None:
    import uvicorn

    settings = parse_settings(argv)
    os.environ.pop(SECRET_ENV, None)        # read once; tensor-parallel workers need no copy
    if settings.secret is None:
        log.warning("no replica secret (%s or %s): this server answers every caller",
                    SECRET_ENV, SECRET_FILE_ENV)
    uvicorn.run(build_app(settings), host=settings.host, port=settings.port, uds=settings.uds,
                log_level=settings.log_level, timeout_graceful_shutdown=5,
                timeout_keep_alive=REPLICA_KEEPALIVE_S,
                access_log=settings.log_level in ("info", "debug"))


if __name__ == "__main__":
    main()
