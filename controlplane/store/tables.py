"""Every table of the control plane, as SQLAlchemy 2 ORM models.

Ids are uuid text. Money is NUMERIC; prices are per million tokens; times are
timestamptz in UTC. The schema only changes through migrations/.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Optional

from sqlalchemy import (ARRAY, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey,
                        ForeignKeyConstraint, Index, Integer, LargeBinary, Numeric, String, Text,
                        UniqueConstraint, Uuid, text)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PRICE = Numeric(18, 9)
MONEY = Numeric(30, 15)


def new_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), str: Text}


def _id_column(*args: Any, **kw: Any) -> Mapped[str]:
    return mapped_column(Uuid(as_uuid=False), *args, **kw)


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    name: Mapped[Optional[str]]
    requests_per_min: Mapped[Optional[int]]
    tokens_per_min: Mapped[Optional[int]]
    # the priorities its calls may ask for and run at (0022; controlplane/auth/priorities.py)
    priority_min: Mapped[Optional[int]] = mapped_column(Integer)
    priority_max: Mapped[Optional[int]] = mapped_column(Integer)
    priority_default: Mapped[Optional[int]] = mapped_column(Integer)
    expires_at: Mapped[Optional[datetime]]
    revoked_at: Mapped[Optional[datetime]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Deployment(Base):
    """A tenant's named endpoint; scaling and the traffic split are mutable."""
    __tablename__ = "deployments"
    __table_args__ = (
        Index("uq_deployments_tenant_name", "tenant_id", "name", unique=True,
              postgresql_where=text("deleted_at IS NULL")),
    )
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str]
    min_replicas: Mapped[int] = mapped_column(Integer)
    max_replicas: Mapped[int] = mapped_column(Integer)
    target_concurrency: Mapped[int] = mapped_column(Integer)
    idle_timeout_s: Mapped[float] = mapped_column(Float)
    sleep_timeout_s: Mapped[float] = mapped_column(Float, server_default=text("0"))   # 0010
    prefetch: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))     # 0011
    # the operator's catalogue base (0016): every tenant may call it and attach adapters
    shared: Mapped[bool] = mapped_column(Boolean, server_default=text("false"), default=False)
    traffic: Mapped[dict[str, Any]] = mapped_column(JSONB)   # {"r1": 90, "r2": 10}
    # where its calls go when it cannot answer (0024): [{"deployment", "on", "cold_wait_s"}],
    # controlplane.deploy.fallback_spec
    fallbacks: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, server_default=text("'[]'::jsonb"), default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[Optional[datetime]]


class Revision(Base):
    """Immutable: model, engine config and resources of one rollout (prices live in the
    operator's price book, `Price`)."""
    __tablename__ = "revisions"
    __table_args__ = (Index("uq_revisions_deployment_number", "deployment_id", "number",
                            unique=True),)
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    deployment_id: Mapped[str] = _id_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    model_uri: Mapped[str]
    architecture: Mapped[Optional[str]]
    # Read from config.json at deploy; NULL on revisions made before migration 0002.
    context_length: Mapped[Optional[int]] = mapped_column(Integer)   # max_position_embeddings
    vocab_size: Mapped[Optional[int]] = mapped_column(Integer)
    # Every object its deploy read, {"s3://bucket/key": {"etag", "size"}}: a cold start
    # refuses other bytes under those keys. NULL on revisions made before migration 0012.
    pinned_objects: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    # A quantized checkpoint's format as the deploy read it (pool.api.ModelInfo.quantization:
    # format, the types kept quantized, the tensors widened); NULL for floats (migration 0015).
    weights: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    engine: Mapped[dict[str, Any]] = mapped_column(JSONB)
    gpu_memory_gb: Mapped[float] = mapped_column(Float)
    gpu_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @property
    def name(self) -> str:
        return f"r{self.number}"


class Adapter(Base):
    """A tenant's PEFT LoRA adapter attached to one base deployment: its own or a shared
    one (migration 0016). What the attach read of it (rank, targets, size) and the ETag
    and size of its two objects, which every load holds the bytes to."""
    __tablename__ = "adapters"
    __table_args__ = (
        Index("uq_adapters_tenant_name", "tenant_id", "name", unique=True,
              postgresql_where=text("deleted_at IS NULL")),
        Index("ix_adapters_deployment", "deployment_id"),
    )
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str]
    deployment_id: Mapped[str] = _id_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    adapter_uri: Mapped[str]                 # s3://bucket/prefix/ of the PEFT folder
    rank: Mapped[int] = mapped_column(Integer)
    target_modules: Mapped[list[str]] = mapped_column(ARRAY(Text))
    weight_bytes: Mapped[int] = mapped_column(BigInteger)
    pinned_objects: Mapped[dict[str, Any]] = mapped_column(JSONB)   # {"s3://...": {"etag", "size"}}
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[Optional[datetime]]


class UsageEvent(Base):
    """One row per invocation. No foreign keys: the outbox may replay rows late."""
    __tablename__ = "usage_events"
    __table_args__ = (Index("ix_usage_tenant_started", "tenant_id", "started_at"),)
    invocation_id: Mapped[str] = _id_column(primary_key=True)
    request_id: Mapped[str]
    tenant_id: Mapped[str] = _id_column()
    api_key_id: Mapped[Optional[str]] = _id_column(nullable=True)
    deployment_id: Mapped[str] = _id_column()
    deployment_name: Mapped[str]
    revision_id: Mapped[str] = _id_column()
    revision_name: Mapped[str]
    model: Mapped[str]
    endpoint: Mapped[str]
    status: Mapped[str]                     # ok | partial | error
    http_status: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    queue_s: Mapped[Optional[float]] = mapped_column(Float)
    cold_start_s: Mapped[Optional[float]] = mapped_column(Float)
    ttft_s: Mapped[Optional[float]] = mapped_column(Float)
    total_s: Mapped[float] = mapped_column(Float)
    cost: Mapped[Decimal] = mapped_column(MONEY)
    replica_id: Mapped[Optional[str]]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    items: Mapped[Optional[int]] = mapped_column(BigInteger)        # function calls only
    gpu_seconds: Mapped[Optional[float]] = mapped_column(Float)      # function calls only
    # billed from the call journal after the control plane died mid-call
    recovered: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # the adapter the call ran with (migration 0016); NULL: the base model
    adapter_id: Mapped[Optional[str]] = _id_column(nullable=True)
    adapter_name: Mapped[Optional[str]]
    adapter_load_s: Mapped[Optional[float]] = mapped_column(Float)   # its wait for the adapter's load


class FunctionCall(Base):
    """An asynchronous function call (`/invoke?async=true`) until its retention ends
    (controlplane.gateway.async_call_rules). `body` is the answer's JSON as text, ASCII-escaped, so
    whatever the function returned is stored as it was (jsonb refuses a \\u0000)."""
    __tablename__ = "function_calls"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'succeeded', 'failed')",
                        name="ck_function_calls_status"),
        CheckConstraint("(status = 'running') = (finished_at IS NULL)",
                        name="ck_function_calls_finished"),
        Index("ix_function_calls_finished_at", "finished_at"),
    )
    id: Mapped[str] = mapped_column(primary_key=True)          # call-<32 hex>
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    deployment_name: Mapped[str]
    status: Mapped[str]                      # running | succeeded | failed
    http_status: Mapped[Optional[int]] = mapped_column(Integer)
    body: Mapped[Optional[str]]
    created_at: Mapped[datetime]
    finished_at: Mapped[Optional[datetime]]


class StoredResponse(Base):
    """A Responses API answer kept for `GET /v1/responses/{id}` and `previous_response_id`
    (controlplane.gateway.responses) until `settings.response_retention_s` after it was made.
    `conversation` is the chat messages its turn answered (the earlier turns and its input,
    not its instructions), `response` the response object; both JSON text, ASCII-escaped
    (jsonb refuses a \\u0000 a model may write)."""
    __tablename__ = "stored_responses"
    __table_args__ = (Index("ix_stored_responses_created_at", "created_at"),)
    id: Mapped[str] = mapped_column(primary_key=True)          # resp_<32 hex>
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str]
    conversation: Mapped[str]
    response: Mapped[str]
    created_at: Mapped[datetime]


class ReplicaLifetime(Base):
    """One replica's life, for GPU-second billing: billed from `placed_at` (the first
    event that carried slot ids) to `stopped_at`, or to `last_seen_at` (the latest event
    or heartbeat that saw it) while no stop is recorded (controlplane.billing.lifetimes)."""
    __tablename__ = "replica_lifetimes"
    __table_args__ = (Index("ix_replica_lifetimes_open", "replica_id",
                            postgresql_where=text("stopped_at IS NULL")),)
    replica_id: Mapped[str] = mapped_column(primary_key=True)
    revision_id: Mapped[str] = _id_column()
    deployment_id: Mapped[str] = _id_column()
    tenant_id: Mapped[str] = _id_column(index=True)
    gpu_count: Mapped[int] = mapped_column(Integer)
    slot_ids: Mapped[list[str]] = mapped_column(ARRAY(Text))
    state: Mapped[str]
    started_at: Mapped[datetime]
    ready_at: Mapped[Optional[datetime]]
    stopped_at: Mapped[Optional[datetime]]
    reason: Mapped[Optional[str]]
    placed_at: Mapped[Optional[datetime]]
    last_seen_at: Mapped[Optional[datetime]]
    # The `loading` event: weights cached, the runtime loads them (the console's waterfall
    # splits download from load here; NULL on rows from before migration 0007).
    loading_at: Mapped[Optional[datetime]]
    # The replica's own counters of what it served (heartbeats, its stop): for reconciling
    # them with the usage rows billed for it.
    served_prompt_tokens: Mapped[Optional[int]] = mapped_column(BigInteger)
    served_completion_tokens: Mapped[Optional[int]] = mapped_column(BigInteger)
    # The sleep tier (migration 0010): when it fell asleep and woke, in turn (an odd count:
    # asleep now); no GPU time is billed between a sleep and its wake.
    sleeps: Mapped[list[datetime]] = mapped_column(ARRAY(DateTime(timezone=True)),
                                                   server_default=text("'{}'"), default=list)
    # The kind of its slots (pool.api.ReplicaEvent.gpu_kind: cuda | cpu; migration 0017),
    # which the operator's cost book prices; NULL: not known (rows from before 0017).
    gpu_kind: Mapped[Optional[str]]


class ModelSource(Base):
    """An admin's grant: tenants may deploy from URIs under `prefix` (tenant_id NULL:
    every tenant, a shared catalogue). Each tenant's own prefix needs no row."""
    __tablename__ = "model_sources"
    __table_args__ = (Index("uq_model_sources_prefix_tenant", "prefix", "tenant_id", unique=True,
                            postgresql_nulls_not_distinct=True),
                      CheckConstraint("(access_key_id IS NULL) = (secret_sealed IS NULL)",
                                      name="ck_model_sources_credentials_whole"))
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    prefix: Mapped[str]                          # s3://bucket/path/
    tenant_id: Mapped[Optional[str]] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                                  nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A tenant's own bucket: read with these credentials, not the platform's (all NULL:
    # the platform's). The secret is sealed by controlplane.sealing, never kept in clear.
    endpoint_url: Mapped[Optional[str]] = mapped_column(Text)
    region: Mapped[Optional[str]] = mapped_column(Text)
    access_key_id: Mapped[Optional[str]] = mapped_column(Text)
    secret_sealed: Mapped[Optional[bytes]] = mapped_column(LargeBinary)


class Price(Base):
    """One row of the operator's price book, in effect from `effective_from` on:
    the default (no tenant), a tenant's plan (tenant only), a deployment's override or an
    adapter's (its owner's tenant, its base deployment and the adapter: migration 0016),
    for interactive calls or for batch lines (`tier`: migration 0023)."""
    __tablename__ = "prices"
    __table_args__ = (
        CheckConstraint("deployment_id IS NULL OR tenant_id IS NOT NULL",
                        name="ck_prices_deployment_has_tenant"),
        CheckConstraint("adapter_id IS NULL OR deployment_id IS NOT NULL",
                        name="ck_prices_adapter_has_deployment"),
        CheckConstraint("tier IN ('interactive', 'batch')", name="ck_prices_tier"),
        Index("uq_prices_scope_effective_from", "tenant_id", "deployment_id", "adapter_id",
              "tier", "effective_from", unique=True, postgresql_nulls_not_distinct=True),
    )
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[Optional[str]] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                                  nullable=True)
    deployment_id: Mapped[Optional[str]] = _id_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), nullable=True)
    adapter_id: Mapped[Optional[str]] = _id_column(
        ForeignKey("adapters.id", ondelete="CASCADE", name="fk_prices_adapter"), nullable=True)
    input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    cached_input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    output_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    gpu_second: Mapped[Decimal] = mapped_column(PRICE)
    per_call: Mapped[Decimal] = mapped_column(PRICE)
    tier: Mapped[str] = mapped_column(server_default=text("'interactive'"), default="interactive")
    effective_from: Mapped[datetime]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class GpuCost(Base):
    """One row of the operator's cost book (migration 0018): what one GPU-second of
    `gpu_kind` costs the platform from `effective_from` on; no kind: the default, for
    every kind without a row of its own (controlplane.billing.costs)."""
    __tablename__ = "gpu_costs"
    __table_args__ = (Index("uq_gpu_costs_kind_effective_from", "gpu_kind", "effective_from",
                            unique=True, postgresql_nulls_not_distinct=True),)
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    gpu_kind: Mapped[Optional[str]]
    per_gpu_second: Mapped[Decimal] = mapped_column(PRICE)
    effective_from: Mapped[datetime]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class QuotaOverride(Base):
    """An admin's overrides of one tenant's quota; NULL keeps the settings default."""
    __tablename__ = "tenant_quotas"
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                        primary_key=True)
    max_gpus: Mapped[Optional[int]] = mapped_column(Integer)
    max_replicas_per_deployment: Mapped[Optional[int]] = mapped_column(Integer)
    max_deployments: Mapped[Optional[int]] = mapped_column(Integer)
    max_queued_requests: Mapped[Optional[int]] = mapped_column(Integer)
    max_upload_bytes: Mapped[Optional[int]] = mapped_column(BigInteger)
    requests_per_min: Mapped[Optional[int]] = mapped_column(Integer)    # all the tenant's keys
    tokens_per_min: Mapped[Optional[int]] = mapped_column(Integer)
    max_async_calls: Mapped[Optional[int]] = mapped_column(Integer)     # in flight at once
    egress: Mapped[Optional[list[str]]] = mapped_column(JSONB)         # "host:port" granted
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelUpload(Base):
    """A tenant's upload of one model folder under its own prefix, as S3 multipart
    uploads (one per file). `files` keeps, per file, what the tenant never sees: the
    object key and S3's upload id."""
    __tablename__ = "model_uploads"
    __table_args__ = (Index("uq_model_uploads_tenant_name", "tenant_id", "name", unique=True,
                            postgresql_where=text("status <> 'deleted'")),)
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str]
    status: Mapped[str]                          # pending | complete | deleted
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    completed_at: Mapped[Optional[datetime]]


class BatchFile(Base):
    """A tenant's file of the OpenAI Files API (migration 0023): its bytes in the models
    bucket under the tenant's own prefix (`object_key`, never shown), its metadata here.
    Purposes: `batch` (uploaded input), `batch_output` (a batch's output or error file)."""
    __tablename__ = "batch_files"
    __table_args__ = (Index("ix_batch_files_tenant_created", "tenant_id", "created_at"),)
    id: Mapped[str] = mapped_column(primary_key=True)          # file-<hex>
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str]
    filename: Mapped[str]
    bytes: Mapped[int] = mapped_column(BigInteger)
    object_key: Mapped[str]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Batch(Base):
    """A tenant's batch (OpenAI's Batch API): its lines are `batch_lines`. The price is
    the one in effect at `created_at` (controlplane.batch.pricing); `api_key_id` is the
    key that created it, whose limits and usage rows its lines carry."""
    __tablename__ = "batches"
    __table_args__ = (
        CheckConstraint("status IN ('in_progress', 'finalizing', 'completed', 'failed', "
                        "'expired', 'cancelling', 'cancelled')", name="ck_batches_status"),
        Index("ix_batches_tenant_created", "tenant_id", "created_at"),
        Index("ix_batches_open", "status",
              postgresql_where=text("status IN ('in_progress', 'finalizing', 'cancelling')")),
    )
    id: Mapped[str] = mapped_column(primary_key=True)          # batch_<hex>
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[str] = _id_column()
    endpoint: Mapped[str]                    # /v1/chat/completions | /v1/completions | /v1/embeddings
    input_file_id: Mapped[str]
    completion_window: Mapped[str]
    status: Mapped[str]
    batch_metadata: Mapped[Optional[dict[str, Any]]] = mapped_column("metadata", JSONB)
    output_file_id: Mapped[Optional[str]]
    error_file_id: Mapped[Optional[str]]
    total: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    finalizing_at: Mapped[Optional[datetime]]
    completed_at: Mapped[Optional[datetime]]
    expired_at: Mapped[Optional[datetime]]
    cancelling_at: Mapped[Optional[datetime]]
    cancelled_at: Mapped[Optional[datetime]]


class BatchLine(Base):
    """One request of a batch, from its validation to its answer. `result` is its whole
    line of the output file (`status` succeeded) or of the error file (failed, expired,
    cancelled), written in the same statement that ends the line; `body` is the request
    as text (jsonb refuses a \\u0000). Its invocation id is derived from (batch, line)."""
    __tablename__ = "batch_lines"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'running', 'succeeded', 'failed', 'expired', "
                        "'cancelled')", name="ck_batch_lines_status"),
        Index("ix_batch_lines_pending", "batch_id", "model",
              postgresql_where=text("status = 'pending'")),
    )
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"),
                                          primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)      # 0-based, input order
    custom_id: Mapped[Optional[str]]
    model: Mapped[Optional[str]]             # the deployment the body names; None for a bad line
    body: Mapped[Optional[str]]
    status: Mapped[str]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    not_before: Mapped[Optional[datetime]]   # a retried line waits until then
    result: Mapped[Optional[str]]


class Budget(Base):
    """A money limit (migration 0019) on a tenant, one of its keys or one of its
    deployments (`scope`, `scope_id`), per calendar `period` in `time_zone`; the soft
    threshold is a fraction of the limit or an amount (at most one is set)."""
    __tablename__ = "budgets"
    __table_args__ = (UniqueConstraint("scope", "scope_id", name="uq_budgets_scope"),
                      Index("ix_budgets_tenant", "tenant_id"))
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    scope: Mapped[str]                           # tenant | key | deployment
    scope_id: Mapped[str] = _id_column()
    limit_amount: Mapped[Decimal] = mapped_column(MONEY)
    period: Mapped[str]                          # day | month | none
    time_zone: Mapped[str] = mapped_column(server_default=text("'UTC'"), default="UTC")
    soft_fraction: Mapped[Optional[Decimal]] = mapped_column(Numeric(6, 5))
    soft_amount: Mapped[Optional[Decimal]] = mapped_column(MONEY)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class BudgetPeriod(Base):
    """One budget's standing in one period: billed spend, and the worst case of the calls
    admitted and not yet metered (controlplane.budgets.ledger)."""
    __tablename__ = "budget_periods"
    budget_id: Mapped[str] = _id_column(ForeignKey("budgets.id", ondelete="CASCADE"), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(primary_key=True)
    period_end: Mapped[Optional[datetime]]       # None: the period of a budget that never resets
    spent: Mapped[Decimal] = mapped_column(MONEY, server_default=text("0"), default=Decimal(0))
    reserved: Mapped[Decimal] = mapped_column(MONEY, server_default=text("0"), default=Decimal(0))


class BudgetReservation(Base):
    """A call's worst-case cost held against one budget in the period it was admitted in,
    until its usage row settles it; past `expires_at` it holds nothing back (`expired`)
    but still says where the call's billed cost belongs."""
    __tablename__ = "budget_reservations"
    __table_args__ = (ForeignKeyConstraint(["budget_id", "period_start"],
                                           ["budget_periods.budget_id", "budget_periods.period_start"],
                                           ondelete="CASCADE"),
                      Index("ix_budget_reservations_live", "expires_at",
                            postgresql_where=text("NOT expired")))
    invocation_id: Mapped[str] = _id_column(primary_key=True)
    budget_id: Mapped[str] = _id_column(primary_key=True)
    period_start: Mapped[datetime]
    amount: Mapped[Decimal] = mapped_column(MONEY)
    expires_at: Mapped[datetime]
    expired: Mapped[bool] = mapped_column(Boolean, server_default=text("false"), default=False)


class BudgetAlertRow(Base):
    """A threshold a budget crossed (soft or hard), once per budget, period and kind."""
    __tablename__ = "budget_alerts"
    __table_args__ = (UniqueConstraint("budget_id", "period_start", "kind", name="uq_budget_alerts_once"),
                      Index("ix_budget_alerts_tenant", "tenant_id", "created_at"))
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    budget_id: Mapped[str] = _id_column(ForeignKey("budgets.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = _id_column()
    scope: Mapped[str]
    scope_id: Mapped[str] = _id_column()
    period_start: Mapped[datetime]
    kind: Mapped[str]                            # soft | hard
    limit_amount: Mapped[Decimal] = mapped_column(MONEY)
    spent: Mapped[Decimal] = mapped_column(MONEY)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookEndpoint(Base):
    """Where webhooks go (migration 0020): registered by a tenant for its own events, or
    by the operator (`operator`: tenants never see it) for one tenant's events or, with
    no tenant, for every tenant's and the platform's. The signing secret is sealed by
    controlplane.sealing, bound to the row, and shown in clear once, at creation."""
    __tablename__ = "webhook_endpoints"
    __table_args__ = (CheckConstraint("operator OR tenant_id IS NOT NULL",
                                      name="ck_webhook_endpoints_owner"),)
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[Optional[str]] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                                  nullable=True, index=True)
    operator: Mapped[bool] = mapped_column(Boolean)
    url: Mapped[str]
    event_types: Mapped[list[str]] = mapped_column(ARRAY(Text))     # names, or ["*"]
    enabled: Mapped[bool] = mapped_column(Boolean)
    description: Mapped[Optional[str]]
    secret_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookEvent(Base):
    """One event published (controlplane.webhooks.publisher), once per `dedupe_key`
    however many control planes publish it; tenant_id NULL: a platform event."""
    __tablename__ = "webhook_events"
    id: Mapped[str] = mapped_column(primary_key=True)          # evt_<32 hex>
    tenant_id: Mapped[Optional[str]] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                                  nullable=True, index=True)
    type: Mapped[str]
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    dedupe_key: Mapped[str] = mapped_column(unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event to one endpoint until it succeeds or is given up. A pending delivery is
    due at `next_attempt_at`; a worker that claims it moves that time past its lease and
    stamps `claim_id`, so only it records the attempt (controlplane.webhooks.deliveries)."""
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'succeeded', 'failed')",
                        name="ck_webhook_deliveries_status"),
        CheckConstraint("(status = 'pending') = (next_attempt_at IS NOT NULL)",
                        name="ck_webhook_deliveries_due"),
        Index("uq_webhook_deliveries_event_endpoint", "event_id", "endpoint_id", unique=True),
        Index("ix_webhook_deliveries_due", "next_attempt_at",
              postgresql_where=text("status = 'pending'")),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "created_at"),
    )
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"))
    endpoint_id: Mapped[str] = _id_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    status: Mapped[str]                      # pending | succeeded | failed
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[Optional[datetime]]
    claim_id: Mapped[Optional[str]] = _id_column(nullable=True)
    last_status_code: Mapped[Optional[int]] = mapped_column(Integer)
    last_error: Mapped[Optional[str]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    completed_at: Mapped[Optional[datetime]]


class WebhookAttempt(Base):
    """One POST of a delivery: the receiver's status code, or the error that stood for
    one (timeout, refused connection, blocked address), and how long it took."""
    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("uq_webhook_attempts_delivery_number", "delivery_id", "number",
                            unique=True),)
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    delivery_id: Mapped[str] = _id_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    duration_ms: Mapped[float] = mapped_column(Float)
    status_code: Mapped[Optional[int]] = mapped_column(Integer)
    error: Mapped[Optional[str]]
