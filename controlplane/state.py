"""What the app holds in `app.state`, set once in the lifespan (controlplane.app).

Routes and the auth middleware read it through `state_of`, typed; tests read
the same attributes (`app.state.sessions`, `app.state.writer`, `app.state.pool`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

    from controlplane.budgets.ledger import Ledger
    from controlplane.gateway.async_calls import AsyncCalls
    from controlplane.batch.files import BatchFiles
    from controlplane.batch.runner import BatchRunner
    from controlplane.batch.service import Batches
    from controlplane.deploy.adapters import Attacher
    from controlplane.deploy.deployer import Deployer
    from controlplane.gateway.llm import Gateway
    from controlplane.gateway.functions import FunctionGateway
    from controlplane.gateway.responses import Responses
    from controlplane.lookups.service import Lookups
    from controlplane.billing.metering import UsageWriter
    from controlplane.metrics import Metrics
    from controlplane.sealing import Sealer
    from controlplane.settings import Settings
    from controlplane.deploy.uploads import Uploads
    from controlplane.webhooks.publisher import WebhookPublisher
    from pool.api import Pool


class AppState(Protocol):
    settings: Settings
    metrics: Metrics
    db_engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    lookups: Lookups
    writer: UsageWriter
    budgets: Ledger
    pool: Pool
    deployer: Deployer
    attacher: Attacher
    gateway: Gateway
    functions: FunctionGateway
    responses: Responses
    async_calls: AsyncCalls
    uploads: Uploads
    sealer: Sealer
    batch_files: BatchFiles
    batches: Batches
    batch_runner: BatchRunner
    webhooks: WebhookPublisher


def state_of(app: Any) -> AppState:
    """`app.state` of a Starlette app built by `create_app`."""
    return cast(AppState, app.state)
