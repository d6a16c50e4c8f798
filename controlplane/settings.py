"""The control plane's one typed settings object: the only reader of the environment."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from controlplane.billing.pricing import Pricing
from controlplane.quotas import Quota
from controlplane.webhooks.backoff import RetryPolicy

GIB = 1024 ** 3


@dataclass(frozen=True)
class Settings:
    """Secrets (the database URL, which carries its password, the S3 keys, the sealing
    key, the metrics token) are left out of repr and str: settings get logged."""
    database_url: str = field(repr=False)
    data_dir: Path = Path.home() / ".thawpool"
    s3_endpoint: Optional[str] = None        # None: AWS S3
    aws_access_key_id: Optional[str] = field(default=None, repr=False)
    aws_secret_access_key: Optional[str] = field(default=None, repr=False)
    aws_region: str = "us-east-1"
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 1_000_000
    acquire_timeout_s: float = 60.0
    upstream_timeout_s: float = 300.0
    # A replica's answer is its tenant's output: a unary body past this, or one line of a
    # stream past the line cap, is refused (502 answer_too_large) and not read further.
    upstream_max_answer_bytes: int = 32 * 1024 ** 2
    upstream_max_line_bytes: int = 8 * 1024 ** 2
    function_call_retention_s: float = 3600.0   # an async function call's result, after it ends
    # A stored Responses API answer (`store`, the default) is readable and continuable this
    # long after it was made (OpenAI keeps them 30 days); the sweep deletes it after.
    response_retention_s: float = 30 * 86_400.0
    response_sweep_s: float = 600.0              # how often expired responses are deleted
    # Spend budgets: a call's reservation holds money back until its usage row settles it,
    # or until this deadline (its control plane died, or the call outlived it); an expired
    # one still tells a late usage row (a recovered call) where it belongs, for the
    # retention. The sweeper runs this often.
    budget_reservation_ttl_s: float = 3600.0
    budget_reservation_retention_s: float = 7 * 86_400.0
    budget_sweep_s: float = 60.0
    default_requests_per_min: int = 600
    default_tokens_per_min: int = 1_000_000
    usage_batch_size: int = 1000
    usage_flush_interval_s: float = 0.05
    usage_buffer_max: int = 10_000       # events in memory; a full buffer spills to the outbox
    outbox_retry_s: float = 1.0
    # The usage outbox and dead-letter file; None: the data dir. Put it on a volume that
    # outlives the instance (terraform mounts an EBS volume there).
    outbox_dir: Optional[Path] = None
    # Postgres: connecting, one statement, waiting for a pooled connection. A database
    # that stops answering fails fast (503, usage to the outbox) instead of hanging.
    db_connect_timeout_s: float = 5.0
    db_statement_timeout_s: float = 15.0
    db_pool_timeout_s: float = 5.0
    # In-memory copies of keys, deployments, prices and quotas: invalidated within a
    # second by LISTEN/NOTIFY, and fully re-read this often in case a notice was lost.
    cache_refresh_s: float = 30.0
    # A bearer key Postgres does not hold is refused from memory this long (a key created
    # meanwhile is known at once): a flood of one made-up key costs a read per this time.
    unknown_key_ttl_s: float = 5.0
    log_level: str = "INFO"
    # Seals what must be kept to be used again (a tenant bucket's secret key): 32 bytes,
    # base64; None: a key file made once in the data dir (controlplane.sealing).
    secrets_key: Optional[str] = field(default=None, repr=False)
    # Model sources: each tenant deploys from s3://<models_bucket>/tenants/<tenant id>/,
    # where its uploads land, and from what an admin grants (never inside tenants/).
    models_bucket: str = "thawpool-models"
    upload_part_bytes: int = 64 * 1024 ** 2       # S3 refuses parts under 5 MiB but the last
    upload_max_file_bytes: int = 100 * GIB
    upload_url_ttl_s: int = 3600                  # presigned part URLs
    upload_ttl_s: int = 86_400                    # a pending upload expires after this
    upload_sweep_s: float = 600.0                 # how often expired multipart uploads are aborted
    # /metrics: on the public listener only with this token (platform metrics only);
    # per-tenant metrics on the internal listener at metrics_host:metrics_port.
    metrics_token: Optional[str] = field(default=None, repr=False)
    metrics_host: str = "127.0.0.1"
    metrics_port: Optional[int] = None
    # The default price (seeded into the price book on first start) and the default
    # quota of every tenant (admins override both per tenant); None: no limit.
    price_input_per_mtok: Decimal = Decimal(0)
    price_cached_input_per_mtok: Decimal = Decimal(0)
    price_output_per_mtok: Decimal = Decimal(0)
    price_gpu_second: Decimal = Decimal(0)
    price_per_call: Decimal = Decimal(0)
    # What one GPU-second costs the platform (the cost book's default, seeded on first
    # start; admins add a cost per GPU kind): the margin report's GPU cost.
    gpu_cost_per_second: Decimal = Decimal(0)
    quota_max_gpus: Optional[int] = 8
    quota_max_replicas_per_deployment: Optional[int] = 8
    quota_max_deployments: Optional[int] = 20
    quota_max_queued_requests: Optional[int] = 256
    quota_max_upload_bytes: Optional[int] = 200 * GIB
    quota_requests_per_min: Optional[int] = None      # tenant-wide, over all its keys
    quota_tokens_per_min: Optional[int] = None
    quota_max_async_calls: Optional[int] = 64         # /invoke?async=true calls in flight
    # The Batch API (controlplane.batch): an input file's size and lines, the runner's
    # round, lines in flight and retries, and the batch price as a fraction of the
    # interactive one in effect when the batch was created.
    batch_file_max_bytes: int = 100 * 1024 ** 2
    batch_max_lines: int = 50_000
    batch_poll_s: float = 1.0
    batch_max_in_flight: int = 64
    batch_max_attempts: int = 5
    batch_retry_s: float = 2.0
    batch_price_discount: Decimal = Decimal("0.5")
    # Webhooks (controlplane.webhooks): how often due deliveries are looked for, how long
    # one POST may take, the retry schedule (controlplane.webhooks.backoff), and whether a
    # tenant's endpoint may reach loopback and private addresses (one-machine setups).
    webhook_poll_s: float = 1.0
    webhook_timeout_s: float = 10.0
    webhook_retry_base_s: float = 5.0
    webhook_retry_cap_s: float = 3600.0
    webhook_max_attempts: int = 12
    webhook_max_age_s: float = 3 * 86_400.0
    webhook_allow_private_targets: bool = False
    webhook_retention_s: float = 30 * 86_400.0     # delivered events, then deleted

    @property
    def outbox_path(self) -> Path:
        return (self.outbox_dir or self.data_dir) / "usage-outbox.jsonl"

    @property
    def dead_letter_path(self) -> Path:
        return (self.outbox_dir or self.data_dir) / "usage-dead-letters.jsonl"

    @property
    def replica_dead_letter_path(self) -> Path:
        return (self.outbox_dir or self.data_dir) / "replica-event-dead-letters.jsonl"

    @property
    def default_pricing(self) -> Pricing:
        return Pricing(self.price_input_per_mtok, self.price_cached_input_per_mtok,
                       self.price_output_per_mtok, self.price_gpu_second, self.price_per_call)

    @property
    def default_quota(self) -> Quota:
        return Quota(self.quota_max_gpus, self.quota_max_replicas_per_deployment,
                     self.quota_max_deployments, self.quota_max_queued_requests,
                     self.quota_max_upload_bytes, self.quota_requests_per_min,
                     self.quota_tokens_per_min, self.quota_max_async_calls)

    @property
    def webhook_retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.webhook_retry_base_s, self.webhook_retry_cap_s,
                           self.webhook_max_attempts, self.webhook_max_age_s)

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Read THAWPOOL_* and AWS_* once; explicit overrides (CLI flags) win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, var, cast in _ENV_FIELDS:
            if var in env and env[var] != "":
                values[name] = cast(env[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "database_url" not in values:
            values["database_url"] = ""
        return cls(**values)


def _flag(value: str) -> bool:
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _limit(value: str) -> Optional[int]:
    """A quota from the environment: an integer, or `none` for no limit."""
    return None if value.strip().lower() in ("none", "unlimited") else int(value)


_ENV_FIELDS: list[tuple[str, str, Callable[[str], Any]]] = [
    ("database_url", "THAWPOOL_DATABASE_URL", str),
    ("data_dir", "THAWPOOL_DATA_DIR", lambda v: Path(v).expanduser()),
    ("s3_endpoint", "THAWPOOL_S3_ENDPOINT", str),
    ("aws_access_key_id", "AWS_ACCESS_KEY_ID", str),
    ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY", str),
    ("aws_region", "AWS_DEFAULT_REGION", str),
    ("host", "THAWPOOL_HOST", str),
    ("port", "THAWPOOL_PORT", int),
    ("max_body_bytes", "THAWPOOL_MAX_BODY_BYTES", int),
    ("acquire_timeout_s", "THAWPOOL_ACQUIRE_TIMEOUT_S", float),
    ("upstream_max_answer_bytes", "THAWPOOL_UPSTREAM_MAX_ANSWER_BYTES", int),
    ("upstream_max_line_bytes", "THAWPOOL_UPSTREAM_MAX_LINE_BYTES", int),
    ("function_call_retention_s", "THAWPOOL_FUNCTION_CALL_RETENTION_S", float),
    ("response_retention_s", "THAWPOOL_RESPONSE_RETENTION_S", float),
    ("response_sweep_s", "THAWPOOL_RESPONSE_SWEEP_S", float),
    ("budget_reservation_ttl_s", "THAWPOOL_BUDGET_RESERVATION_TTL_S", float),
    ("budget_reservation_retention_s", "THAWPOOL_BUDGET_RESERVATION_RETENTION_S", float),
    ("budget_sweep_s", "THAWPOOL_BUDGET_SWEEP_S", float),
    ("default_requests_per_min", "THAWPOOL_REQUESTS_PER_MIN", int),
    ("default_tokens_per_min", "THAWPOOL_TOKENS_PER_MIN", int),
    ("log_level", "THAWPOOL_LOG_LEVEL", str),
    ("secrets_key", "THAWPOOL_SECRETS_KEY", str),
    ("usage_buffer_max", "THAWPOOL_USAGE_BUFFER_MAX", int),
    ("outbox_dir", "THAWPOOL_OUTBOX_DIR", lambda v: Path(v).expanduser()),
    ("db_connect_timeout_s", "THAWPOOL_DB_CONNECT_TIMEOUT_S", float),
    ("db_statement_timeout_s", "THAWPOOL_DB_STATEMENT_TIMEOUT_S", float),
    ("db_pool_timeout_s", "THAWPOOL_DB_POOL_TIMEOUT_S", float),
    ("cache_refresh_s", "THAWPOOL_CACHE_REFRESH_S", float),
    ("unknown_key_ttl_s", "THAWPOOL_UNKNOWN_KEY_TTL_S", float),
    ("models_bucket", "THAWPOOL_MODELS_BUCKET", str),
    ("upload_part_bytes", "THAWPOOL_UPLOAD_PART_BYTES", int),
    ("upload_max_file_bytes", "THAWPOOL_UPLOAD_MAX_FILE_BYTES", int),
    ("metrics_token", "THAWPOOL_METRICS_TOKEN", str),
    ("metrics_host", "THAWPOOL_METRICS_HOST", str),
    ("metrics_port", "THAWPOOL_METRICS_PORT", int),
    *[(f"price_{name}", f"THAWPOOL_PRICE_{name.upper()}", Decimal)
      for name in ("input_per_mtok", "cached_input_per_mtok", "output_per_mtok", "gpu_second",
                   "per_call")],
    ("gpu_cost_per_second", "THAWPOOL_GPU_COST_PER_SECOND", Decimal),
    ("batch_file_max_bytes", "THAWPOOL_BATCH_FILE_MAX_BYTES", int),
    ("batch_max_lines", "THAWPOOL_BATCH_MAX_LINES", int),
    ("batch_poll_s", "THAWPOOL_BATCH_POLL_S", float),
    ("batch_max_in_flight", "THAWPOOL_BATCH_MAX_IN_FLIGHT", int),
    ("batch_max_attempts", "THAWPOOL_BATCH_MAX_ATTEMPTS", int),
    ("batch_retry_s", "THAWPOOL_BATCH_RETRY_S", float),
    ("batch_price_discount", "THAWPOOL_BATCH_PRICE_DISCOUNT", Decimal),
    *[(f"quota_{name}", f"THAWPOOL_QUOTA_{name.upper()}", _limit)
      for name in ("max_gpus", "max_replicas_per_deployment", "max_deployments",
                   "max_queued_requests", "max_upload_bytes", "requests_per_min",
                   "tokens_per_min", "max_async_calls")],
    *[(f"webhook_{name}", f"THAWPOOL_WEBHOOK_{name.upper()}", float)
      for name in ("poll_s", "timeout_s", "retry_base_s", "retry_cap_s", "max_age_s",
                   "retention_s")],
    ("webhook_max_attempts", "THAWPOOL_WEBHOOK_MAX_ATTEMPTS", int),
    ("webhook_allow_private_targets", "THAWPOOL_WEBHOOK_ALLOW_PRIVATE_TARGETS", _flag),
]
