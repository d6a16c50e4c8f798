"""`thawpool up`: the embedded Postgres and S3 (unless external ones are named), the
pool and the control plane in one process, stopped cleanly on SIGTERM or SIGINT.

`up` embeds Postgres and S3 unless pointed at external ones (`--database-url`
or THAWPOOL_DATABASE_URL; `--s3-endpoint URL|aws`), and runs replicas as local
processes unless `--backend ray` (or `--ray-address`) puts them on a Ray cluster.
Heavy modules are imported where used: every other command starts without them.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from controlplane.cli.output import Subcommands

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

    from controlplane.settings import Settings
    from controlplane.auth.keys import NewKey
    from pool.settings import PoolSettings
    from controlplane.app import PoolFactory


def add_up(commands: Subcommands) -> None:
    up = commands.add_parser("up", help="run Postgres, S3, the pool and the control plane")
    up.add_argument("--data-dir", type=lambda v: Path(v).expanduser(), default=None,
                    help="where embedded data lives (default ~/.thawpool)")
    up.add_argument("--host", default=None)
    up.add_argument("--port", type=int, default=None)
    up.add_argument("--database-url", default=None, help="external Postgres (asyncpg URL)")
    up.add_argument("--s3-endpoint", default=None, help="external S3 endpoint, or 'aws'")
    up.add_argument("--accelerator", choices=["auto", "cuda", "cpu"], default=None)
    up.add_argument("--cpu-slots", type=int, default=None)
    up.add_argument("--slot-memory-gb", type=float, default=None)
    up.add_argument("--backend", choices=["local", "ray"], default=None,
                    help="where replicas run: local processes (default) or a Ray cluster "
                         "(THAWPOOL_BACKEND)")
    up.add_argument("--ray-address", default=None,
                    help="Ray cluster to join, e.g. HEAD:6379 or 'auto'; implies --backend ray "
                         "(THAWPOOL_RAY_ADDRESS)")
    up.add_argument("--stop-grace", type=float, default=30.0, metavar="SECONDS",
                    help="how long requests in flight may finish after SIGTERM or SIGINT before "
                         "they are cut and the shutdown goes on (default 30)")
    up.add_argument("--demo", action="store_true",
                    help="deploy a small model, stream a completion, print the bill")
    up.set_defaults(func=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    import uvloop

    from controlplane.db import migrate
    from controlplane.embedded.data_dir_lock import DataDirInUse
    from controlplane.logs import configure_logging
    from controlplane.settings import Settings
    from controlplane.embedded.stack import EmbeddedStack

    settings = Settings.from_env(data_dir=args.data_dir, host=args.host, port=args.port,
                                 database_url=args.database_url, s3_endpoint=args.s3_endpoint)
    configure_logging(settings.log_level)
    stack = EmbeddedStack(settings)
    try:
        stack.claim()
    except DataDirInUse as exc:
        print(f"thawpool up: {exc}", file=sys.stderr, flush=True)
        return 1
    for sig in STOP_SIGNALS:                # stop children even mid-start
        signal.signal(sig, _raise_interrupt)
    try:
        settings = stack.start()
        migrate(settings.database_url)
        # uvloop: libuv's event loop, in C (uvicorn's own default where it is installed, as
        # for the replicas): the gateway's socket reads, writes and polls cost less of each call
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(settings, args))
    except KeyboardInterrupt:
        pass
    finally:
        # the loop's handlers are gone with the loop (SIGTERM's default would kill us now):
        # a second signal must not cut the stop of Postgres and S3 short
        _hold_signals()
        print("thawpool: stopping embedded servers", flush=True)
        stack.stop()
        print("thawpool: stopped", flush=True)
        # the interpreter's last collection would walk the whole heap (about 0.6 s of a
        # stop, after everything is stopped); nothing it could free matters any more
        gc.freeze()
    return 0


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)      # systemd's stop, Ctrl-C


def _raise_interrupt(signum: int, frame: Optional[FrameType]) -> NoReturn:
    _say_stopping(signum)
    _hold_signals()                 # the cleanup the interrupt starts runs to its end
    raise KeyboardInterrupt


def _hold_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _still_stopping)


def _say_stopping(signum: int) -> None:
    print(f"thawpool: {signal.Signals(signum).name} received, stopping", flush=True)


def _still_stopping(signum: int, frame: Optional[FrameType] = None) -> None:
    print(f"thawpool: {signal.Signals(signum).name} received again; still stopping", flush=True)


async def _serve(settings: Settings, args: argparse.Namespace) -> None:
    import uvicorn

    from controlplane.app import create_app

    # the key file is written before the server answers /readyz: whoever waits for ready
    # (a script, a test harness) may read it at once
    admin_line = _admin_line(await _bootstrap_admin(settings), settings)
    pool_settings = pool_settings_for(settings, args)
    app = create_app(settings, pool_factory=_pool_factory(pool_settings))
    # proxy_headers off: nothing reads the client's address, and uvicorn's rewrite of it
    # from X-Forwarded-For would be one more layer on every call
    # timeout_graceful_shutdown: a request that never ends (a stalled client) must not hold
    # the stop of the pool and the servers until systemd's SIGKILL ends `up` without it
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                           lifespan="on", log_level="warning",
                                           access_log=False, proxy_headers=False,
                                           timeout_graceful_shutdown=args.stop_grace))
    server.capture_signals = contextlib.nullcontext      # type: ignore[method-assign,assignment]  # ours below: stop, then clean up
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _stopper(server), sig)
    serving = asyncio.create_task(server.serve())
    metrics = _metrics_server(app, settings)
    metrics_serving = asyncio.create_task(metrics.serve()) if metrics else None
    while not server.started:
        if serving.done():
            return serving.result()
        await asyncio.sleep(0.05)
    base_url = f"http://{settings.host}:{settings.port}"
    _banner(settings, base_url, admin_line, pool_settings)
    if args.demo:
        demo = asyncio.create_task(_demo(app, settings, base_url))
        demo.add_done_callback(_report_demo)
    await serving
    if metrics is not None and metrics_serving is not None:
        metrics.should_exit = True
        await metrics_serving


def _metrics_server(app: Starlette, settings: Settings) -> Optional[uvicorn.Server]:
    """The internal metrics listener (settings.metrics_port): every series, tenants' names
    included, no auth; None when no port is set."""
    if settings.metrics_port is None:
        return None
    import uvicorn

    from controlplane.app import create_metrics_app

    server = uvicorn.Server(uvicorn.Config(
        create_metrics_app(app.state.metrics), host=settings.metrics_host,
        port=settings.metrics_port, lifespan="off", log_level="warning", access_log=False))
    server.capture_signals = contextlib.nullcontext      # type: ignore[method-assign,assignment]  # the main server's handlers stop both
    return server


def _stopper(server: uvicorn.Server) -> Callable[[int], None]:
    """A signal stops the server, then the lifespan stops the pool (replicas, Ray actors)
    and flushes metering. A second one cuts requests in flight at once (force_exit): the
    lifespan's cleanup still runs when the closing event loop cancels it."""
    def stop(signum: int) -> None:
        if server.should_exit:
            print(f"thawpool: {signal.Signals(signum).name} received again; cutting requests short",
                  flush=True)
            server.force_exit = True
            return
        _say_stopping(signum)
        server.should_exit = True
    return stop


def _admin_line(new_admin: Optional[NewKey], settings: Settings) -> str:
    """The banner's admin-key line; a new key goes to the terminal or its 0600 file now."""
    if new_admin is None:
        return "thawpool: admin key      made on first start (pass it as THAWPOOL_ADMIN_KEY)"
    from controlplane.cli.admin_key import announce

    return announce(new_admin.secret, settings.data_dir, sys.stdout)


def _banner(settings: Settings, base_url: str, admin_line: str, pool_settings: PoolSettings) -> None:
    lines = [f"thawpool: control plane  {base_url}   (OpenAI base URL {base_url}/v1)",
             f"thawpool: postgres       {_without_password(settings.database_url)}",
             f"thawpool: s3             {settings.s3_endpoint or 'AWS'}",
             f"thawpool: pool backend   {_backend_line(pool_settings)}",
             f"thawpool: sandbox        {_sandbox_line(pool_settings)}",
             f"thawpool: data dir       {settings.data_dir}", admin_line]
    print("\n".join(lines), flush=True)


async def _bootstrap_admin(settings: Settings) -> Optional[NewKey]:
    from controlplane.db import create_db_engine, sessionmaker
    from controlplane.store.tenants import bootstrap_admin

    db_engine = create_db_engine(settings.database_url)
    try:
        async with sessionmaker(db_engine).begin() as session:
            return await bootstrap_admin(session)
    finally:
        await db_engine.dispose()


def _without_password(url: str) -> str:
    """The database URL for the banner: an external one carries a password, logs must not."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: show nothing of it
        return "(unparsable database URL)"


def _sandbox_line(pool_settings: PoolSettings) -> str:
    if pool_settings.sandbox == "off":
        return "OFF: tenants' functions and models run unconfined (THAWPOOL_SANDBOX=off)"
    return "bubblewrap: each replica and build as a uid of its own, no network (docs/security.md)"


def _backend_line(pool_settings: PoolSettings) -> str:
    if pool_settings.backend == "ray":
        return f"ray (cluster {pool_settings.ray_address or 'from RAY_ADDRESS or this machine'})"
    return "local processes"


def _pool_factory(pool_settings: PoolSettings) -> PoolFactory:
    from pool.manager import PoolManager

    return lambda desired, events: PoolManager(pool_settings, desired, events)


def pool_settings_for(settings: Settings, args: argparse.Namespace) -> PoolSettings:
    """PoolSettings from the environment (THAWPOOL_*), then the `up` flags, which win."""
    from pool.settings import PoolSettings

    overrides: dict[str, Any] = {"s3_endpoint": settings.s3_endpoint, "s3_region": settings.aws_region,
                 "aws_access_key_id": settings.aws_access_key_id,
                 "aws_secret_access_key": settings.aws_secret_access_key,
                 "cache_dir": settings.data_dir / "cache", "log_dir": settings.data_dir / "logs"}
    for name in ("accelerator", "cpu_slots", "slot_memory_gb", "backend", "ray_address"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    if args.cpu_slots is not None and args.accelerator is None:
        overrides["accelerator"] = "cpu"
    if args.ray_address is not None and args.backend is None:
        overrides["backend"] = "ray"          # an address only makes sense for the Ray backend
    return PoolSettings.from_env(**overrides)


async def _demo(app: Starlette, settings: Settings, base_url: str) -> None:
    from controlplane.cli.demo import DEMO_PRICES, DEMO_TENANT, run_demo
    from controlplane.store.tables import utcnow
    from controlplane.store import prices
    from controlplane.store.errors import NotFound
    from controlplane.store.tenants import create_key, create_tenant, find_tenant

    async with app.state.sessions.begin() as session:
        try:
            tenant = await find_tenant(session, DEMO_TENANT)
        except NotFound:
            tenant = await create_tenant(session, DEMO_TENANT)
        if not await prices.book(session, tenant):        # the operator prices the demo
            await prices.add(session, DEMO_PRICES, utcnow(), tenant)
        _, key = await create_key(session, tenant, ["billing:read", "deploy", "invoke"],
                                  name="demo")
    print(f"thawpool: demo tenant key {key.secret}", flush=True)
    await run_demo(settings, base_url, tenant.id, key.secret, app.state.writer.flush)


def _report_demo(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        print(f"thawpool: demo failed: {task.exception()!r}", file=sys.stderr, flush=True)
    else:
        print("thawpool: demo done; the server stays up (Ctrl-C stops it)", flush=True)
