"""The control plane's one typed settings object: the only reader of the environment."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional


@dataclass(frozen=True)
class Settings:
    database_url: str
    data_dir: Path = Path.home() / ".thawpool"
    s3_endpoint: Optional[str] = None        # None: AWS S3
    aws_access_key_id: Optional[str] = None
    aws_secret_access_key: Optional[str] = None
    aws_region: str = "us-east-1"
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 1_000_000
    acquire_timeout_s: float = 60.0
    upstream_timeout_s: float = 300.0
    default_requests_per_min: int = 600
    default_tokens_per_min: int = 1_000_000
    usage_batch_size: int = 1000
    usage_flush_interval_s: float = 0.05
    outbox_retry_s: float = 1.0
    log_level: str = "INFO"

    @property
    def outbox_path(self) -> Path:
        return self.data_dir / "usage-outbox.jsonl"

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
    ("default_requests_per_min", "THAWPOOL_REQUESTS_PER_MIN", int),
    ("default_tokens_per_min", "THAWPOOL_TOKENS_PER_MIN", int),
    ("log_level", "THAWPOOL_LOG_LEVEL", str),
]


def admin_key_from_env(environ: Mapping[str, str] | None = None) -> Optional[str]:
    """The CLI's admin key (THAWPOOL_ADMIN_KEY) and server URL are client settings."""
    env = os.environ if environ is None else environ
    return env.get("THAWPOOL_ADMIN_KEY") or None


def server_url_from_env(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("THAWPOOL_URL", "http://127.0.0.1:8080")
