"""The Starlette app factory: collaborators in, every client created in the lifespan."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Optional

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from controlplane.auth import AuthMiddleware
from controlplane.db import create_engine, sessionmaker
from controlplane.desired_state import PostgresDesiredState, PostgresReplicaEvents
from controlplane.errors import (ApiError, api_error_handler, http_exception_handler,
                                 unhandled_error_handler)
from controlplane.gateway import Gateway
from controlplane.metering import UsageWriter
from controlplane.metrics import Metrics, MetricsMiddleware
from controlplane.modelcheck import ModelChecker
from controlplane.outbox import Outbox
from controlplane.requestid import RequestIdMiddleware
from controlplane.routes import billing, deployments, gateway, health, tenants
from controlplane.settings import Settings

log = logging.getLogger("thawpool.app")
PoolFactory = Callable[[PostgresDesiredState, PostgresReplicaEvents], Any]


def create_app(settings: Settings, pool: Any = None, *,
               pool_factory: Optional[PoolFactory] = None) -> Starlette:
    """`pool` is used as given (its owner starts and stops it); a `pool_factory` gets the
    app's DesiredStateSource and ReplicaEventSink and its pool is started and stopped here."""
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        async with contextlib.AsyncExitStack() as stack:
            engine = create_engine(settings.database_url)
            stack.push_async_callback(engine.dispose)
            sessions = sessionmaker(engine)
            writer = UsageWriter(engine, Outbox(settings.outbox_path), metrics,
                                 batch_size=settings.usage_batch_size,
                                 flush_interval_s=settings.usage_flush_interval_s,
                                 retry_s=settings.outbox_retry_s)
            await writer.start()
            stack.push_async_callback(writer.stop)
            http = await stack.enter_async_context(httpx.AsyncClient(
                timeout=httpx.Timeout(settings.upstream_timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100)))
            s3 = await stack.enter_async_context(_s3_client(settings))
            the_pool = pool
            if pool_factory is not None:
                the_pool = pool_factory(PostgresDesiredState(sessions),
                                        PostgresReplicaEvents(sessions))
                await the_pool.start()
                stack.push_async_callback(the_pool.stop)
            app.state.settings = settings
            app.state.engine = engine
            app.state.sessions = sessions
            app.state.writer = writer
            app.state.pool = the_pool
            app.state.model_checker = ModelChecker(s3)
            app.state.gateway = Gateway(sessions=sessions, pool=the_pool, http=http,
                                        writer=writer, metrics=metrics, settings=settings)
            yield

    app = Starlette(
        routes=[*health.routes, *tenants.routes, *deployments.routes, *gateway.routes,
                *billing.routes],
        exception_handlers={ApiError: api_error_handler, HTTPException: http_exception_handler,
                            Exception: unhandled_error_handler},
        lifespan=lifespan)
    app.state.metrics = metrics
    app.add_middleware(AuthMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)
    return app


def _s3_client(settings: Settings):
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    return get_session().create_client(
        "s3", endpoint_url=settings.s3_endpoint, region_name=settings.aws_region,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
        config=AioConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))
