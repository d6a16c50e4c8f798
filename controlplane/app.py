"""The Starlette app factory: collaborators in, every client created in the lifespan."""
from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import AsyncIterator, Callable, Optional

from starlette.applications import Starlette
from starlette.middleware import Middleware

from controlplane.budgets.alerts import BudgetAlertSink
from controlplane.budgets.ledger import Ledger
from controlplane.gateway.async_calls import AsyncCalls
from controlplane.batch.files import BatchFiles
from controlplane.batch.runner import BatchRunner, RunnerConfig
from controlplane.batch.service import Batches
from controlplane.auth.middleware import AuthMiddleware
from controlplane.console import ConsoleFiles
from controlplane.routes import console
from controlplane.db import create_db_engine, sessionmaker
from controlplane.deploy.adapters import Attacher
from controlplane.deploy.deployer import Deployer
from controlplane.errors import (DATABASE_ERRORS, REFUSALS, database_error_handler,
                                 refusal_handler, unhandled_error_handler)
from controlplane.gateway.llm import Gateway
from controlplane.gateway.functions import FunctionGateway
from controlplane.gateway.response_retention import Retention
from controlplane.gateway.responses import Responses
from controlplane.lookups.listener import libpq_dsn
from controlplane.lookups.service import Lookups
from controlplane.billing.metering import UsageWriter
from controlplane.metrics import Metrics, MetricsMiddleware
from controlplane.store.tables import utcnow
from controlplane.billing.outbox import DeadLetters, Outbox
from controlplane.periodic import Periodic
from controlplane.routes import (adapters, batches, billing, budgets, deployments, files, functions,
                                 gateway, gpu_costs, health, margin, model_sources, models_list, openapi,
                                 prices, quotas, responses, tenants, uploads, webhooks)
from controlplane.billing.refusals import DeadLetteringSink
from controlplane.sealing import load_sealer
from controlplane.settings import Settings
from controlplane.state import AppState, state_of
from controlplane.store.desired_state import PostgresDesiredState, PostgresReplicaEvents
from controlplane.store import gpu_costs as cost_book
from controlplane.store.prices import seed_default
from controlplane.webhooks import history
from controlplane.webhooks.budget_alerts import WebhookAlertSink
from controlplane.webhooks.publisher import WebhookPublisher
from controlplane.webhooks.sender import Sender
from controlplane.webhooks.worker import WebhookWorker
from controlplane.deploy.uploads import S3Client, UploadConfig, Uploads, open_s3_client
from controlplane.gateway.upstream import Upstream
from pool.api import Pool, ReplicaEventSink
from wire.request_id import RequestIdMiddleware

PoolFactory = Callable[[PostgresDesiredState, ReplicaEventSink], Pool]
# The invocation routes first: Starlette tries each route's pattern in order, and these
# take nearly every request (no other pattern matches their paths, so the order is free).
ROUTES = [*gateway.routes, *responses.routes, *functions.routes, *health.routes, *openapi.routes, *tenants.routes,
          *quotas.routes, *model_sources.routes, *uploads.routes, *prices.routes, *gpu_costs.routes,
          *deployments.routes, *adapters.routes, *models_list.routes, *billing.routes, *margin.routes,
          *files.routes, *batches.routes, *budgets.routes, *webhooks.routes, *console.routes]


def create_app(settings: Settings, pool: Optional[Pool] = None, *,
               pool_factory: Optional[PoolFactory] = None,
               alert_sink: Optional[BudgetAlertSink] = None) -> Starlette:
    """Exactly one of `pool` (used as given: its owner starts and stops it) and
    `pool_factory` (given the app's DesiredStateSource and ReplicaEventSink; its pool is
    started and stopped with the app). Budget threshold crossings go to `alert_sink`
    (default: a log line each and a `budget.threshold` webhook event)."""
    make_pool, owns_pool = _pool_maker(pool, pool_factory)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            db_engine = create_db_engine(
                settings.database_url, connect_timeout_s=settings.db_connect_timeout_s,
                statement_timeout_s=settings.db_statement_timeout_s,
                pool_timeout_s=settings.db_pool_timeout_s)
            stack.push_async_callback(db_engine.dispose)
            sessions = sessionmaker(db_engine)
            publisher = WebhookPublisher(sessions)
            alerts = alert_sink or WebhookAlertSink(publisher)
            async with sessions.begin() as session:
                await seed_default(session, settings.default_pricing)
                await cost_book.seed_default(session, settings.gpu_cost_per_second)
            lookups = Lookups(sessions, settings.default_quota, refresh_s=settings.cache_refresh_s,
                              listen_dsn=libpq_dsn(settings.database_url),
                              timeout_s=settings.db_connect_timeout_s,
                              unknown_key_ttl_s=settings.unknown_key_ttl_s)
            await lookups.start()
            stack.push_async_callback(lookups.stop)
            writer = UsageWriter(db_engine, Outbox(settings.outbox_path), metrics,
                                 batch_size=settings.usage_batch_size,
                                 flush_interval_s=settings.usage_flush_interval_s,
                                 retry_s=settings.outbox_retry_s,
                                 buffer_max=settings.usage_buffer_max,
                                 dead_letters=DeadLetters(settings.dead_letter_path), alerts=alerts)
            await writer.start()
            stack.push_async_callback(writer.stop)
            http = await stack.enter_async_context(Upstream(
                read_timeout_s=settings.upstream_timeout_s,
                max_answer_bytes=settings.upstream_max_answer_bytes,
                max_line_bytes=settings.upstream_max_line_bytes))
            s3 = await open_s3_client(stack, settings.s3_endpoint, settings.aws_region,
                                      settings.aws_access_key_id, settings.aws_secret_access_key)
            sealer = load_sealer(settings.secrets_key, settings.data_dir)
            the_pool = make_pool(PostgresDesiredState(sessions, settings.default_quota, sealer),
                                 DeadLetteringSink(PostgresReplicaEvents(sessions),
                                                   DeadLetters(settings.replica_dead_letter_path)))
            if owns_pool:
                await the_pool.start()
                stack.push_async_callback(the_pool.stop)
            # last in, first out: calls in flight are cancelled before what they use closes
            calls = AsyncCalls(sessions, settings.function_call_retention_s)
            await calls.start()
            stack.push_async_callback(calls.stop)
            state = state_of(app)
            state.settings, state.db_engine, state.sessions = settings, db_engine, sessions
            state.lookups, state.async_calls = lookups, calls
            state.writer, state.pool, state.sealer = writer, the_pool, sealer
            state.webhooks = publisher
            state.budgets = Ledger(db_engine, alerts, reservation_ttl_s=settings.budget_reservation_ttl_s,
                                   retention_s=settings.budget_reservation_retention_s)
            _workers(state, s3, http)
            for sweeper in (Periodic("abort expired uploads", settings.upload_sweep_s,
                                     lambda: state.uploads.abort_expired(utcnow())),
                            Periodic("expire budget reservations", settings.budget_sweep_s,
                                     lambda: state.budgets.expire(utcnow())),
                            Periodic("delete expired responses", settings.response_sweep_s,
                                     state.responses.sweep)):
                sweeper.start()
                stack.push_async_callback(sweeper.stop)
            await state.batch_runner.start()
            stack.push_async_callback(state.batch_runner.stop)
            await _start_webhooks(stack, state)
            yield

    app = Starlette(
        routes=ROUTES,
        # in the order they run: the request id first (every answer carries it, auth's
        # refusals too), then metrics (they count refusals), then auth
        middleware=[Middleware(RequestIdMiddleware, access_log=logging.getLogger("thawpool.access")),
                    Middleware(ConsoleFiles),       # /ui: public files, before metrics and auth
                    Middleware(MetricsMiddleware, metrics=metrics),
                    Middleware(AuthMiddleware, public_paths=frozenset(
                        r.path for r in ROUTES if not r.operation.access.needs_key))],
        exception_handlers={**{kind: refusal_handler for kind in REFUSALS},
                            **{kind: database_error_handler for kind in DATABASE_ERRORS},
                            Exception: unhandled_error_handler},
        lifespan=lifespan)
    state_of(app).metrics = metrics
    return app


def _workers(state: AppState, s3: S3Client, http: Upstream) -> None:
    """The deployer, the attacher, uploads and gateway over what the lifespan opened."""
    settings, sessions = state.settings, state.sessions
    state.deployer = Deployer(sessions, state.pool, models_bucket=settings.models_bucket,
                              default_quota=settings.default_quota, lookups=state.lookups)
    state.attacher = Attacher(sessions, state.pool, models_bucket=settings.models_bucket,
                              lookups=state.lookups)
    state.uploads = Uploads(sessions, s3, UploadConfig(
        settings.models_bucket, settings.upload_part_bytes, settings.upload_url_ttl_s,
        settings.upload_ttl_s, settings.default_quota))
    state.gateway = Gateway(lookups=state.lookups, pool=state.pool, http=http,
                            writer=state.writer, metrics=state.metrics, settings=settings,
                            budgets=state.budgets)
    state.functions = FunctionGateway(state.gateway)
    state.responses = Responses(state.gateway, sessions, Retention(settings.response_retention_s))
    state.batch_files = BatchFiles(sessions, s3, settings.models_bucket, settings.batch_file_max_bytes)
    state.batches = Batches(sessions, state.batch_files, state.gateway, settings.batch_max_lines)
    state.batch_runner = BatchRunner(sessions, state.gateway, state.lookups, state.pool, state.batch_files,
                                     RunnerConfig(settings.batch_poll_s, settings.batch_max_in_flight,
                                                  settings.batch_max_attempts, settings.batch_retry_s,
                                                  settings.batch_price_discount))


async def _start_webhooks(stack: contextlib.AsyncExitStack, state: AppState) -> None:
    """The worker that delivers what the publisher (state.webhooks) enqueued (stopped before its
    sender closes)."""
    settings = state.settings
    sender = await stack.enter_async_context(Sender(settings.webhook_timeout_s,
                                                    settings.webhook_allow_private_targets))
    worker = WebhookWorker(state.sessions, state.sealer, sender, settings.webhook_retry_policy)
    delivering = Periodic("deliver webhooks", settings.webhook_poll_s, worker.drain)
    pruning = Periodic("prune webhook history", history.PRUNE_EVERY_S,
                       lambda: _prune_webhooks(state))
    for chore in (delivering, pruning):
        chore.start()
        stack.push_async_callback(chore.stop)


async def _prune_webhooks(state: AppState) -> int:
    before = utcnow() - timedelta(seconds=state.settings.webhook_retention_s)
    async with state.sessions.begin() as session:
        return await history.prune(session, before)


def create_metrics_app(metrics: Metrics) -> Starlette:
    """The internal listener's app: every metric, tenants' included, with no auth; serve
    it on loopback or an internal network only (`settings.metrics_port`)."""
    app = Starlette(routes=health.internal_routes)
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
