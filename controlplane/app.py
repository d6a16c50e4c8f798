"""The Starlette app factory: collaborators in, every client created in the lifespan."""
from __future__ import annotations

import contextlib
import logging
from typing import AsyncIterator, Callable, Optional

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware

from controlplane.auth import AuthMiddleware
from controlplane.db import create_db_engine, sessionmaker
from controlplane.deployer import Deployer
from controlplane.errors import REFUSALS, refusal_handler, unhandled_error_handler
from controlplane.gateway import Gateway
from controlplane.metering import UsageWriter
from controlplane.metrics import Metrics, MetricsMiddleware
from controlplane.outbox import Outbox
from controlplane.routes import billing, deployments, gateway, health, tenants
from controlplane.settings import Settings
from controlplane.state import state_of
from controlplane.store.desired_state import PostgresDesiredState, PostgresReplicaEvents
from pool.api import Pool
from wire.request_id import RequestIdMiddleware

PoolFactory = Callable[[PostgresDesiredState, PostgresReplicaEvents], Pool]


def create_app(settings: Settings, pool: Optional[Pool] = None, *,
               pool_factory: Optional[PoolFactory] = None) -> Starlette:
    """Exactly one of `pool` (used as given: its owner starts and stops it) and
    `pool_factory` (given the app's DesiredStateSource and ReplicaEventSink; its pool is
    started and stopped with the app)."""
    make_pool, owns_pool = _pool_maker(pool, pool_factory)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            db_engine = create_db_engine(settings.database_url)
            stack.push_async_callback(db_engine.dispose)
            sessions = sessionmaker(db_engine)
            writer = UsageWriter(db_engine, Outbox(settings.outbox_path), metrics,
                                 batch_size=settings.usage_batch_size,
                                 flush_interval_s=settings.usage_flush_interval_s,
                                 retry_s=settings.outbox_retry_s)
            await writer.start()
            stack.push_async_callback(writer.stop)
            http = await stack.enter_async_context(httpx.AsyncClient(
                timeout=httpx.Timeout(settings.upstream_timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100)))
            the_pool = make_pool(PostgresDesiredState(sessions), PostgresReplicaEvents(sessions))
            if owns_pool:
                await the_pool.start()
                stack.push_async_callback(the_pool.stop)
            state = state_of(app)
            state.settings = settings
            state.db_engine = db_engine
            state.sessions = sessions
            state.writer = writer
            state.pool = the_pool
            state.deployer = Deployer(sessions, the_pool)
            state.gateway = Gateway(sessions=sessions, pool=the_pool, http=http, writer=writer,
                                    metrics=metrics, settings=settings)
            yield

    app = Starlette(
        routes=[*health.routes, *tenants.routes, *deployments.routes, *gateway.routes,
                *billing.routes],
        # in the order they run: the request id first (every answer carries it, auth's
        # refusals too), then metrics (they count refusals), then auth
        middleware=[Middleware(RequestIdMiddleware, access_log=logging.getLogger("thawpool.access")),
                    Middleware(MetricsMiddleware, metrics=metrics),
                    Middleware(AuthMiddleware)],
        exception_handlers={**{kind: refusal_handler for kind in REFUSALS},
                            Exception: unhandled_error_handler},
        lifespan=lifespan)
    state_of(app).metrics = metrics
    return app


def _pool_maker(pool: Optional[Pool],
                pool_factory: Optional[PoolFactory]) -> tuple[PoolFactory, bool]:
    """What the lifespan calls for its pool, and whether the app starts and stops it."""
    if pool is not None and pool_factory is None:
        return (lambda desired, events: pool), False
    if pool_factory is not None and pool is None:
        return pool_factory, True
    raise TypeError("create_app: pass either pool or pool_factory")
