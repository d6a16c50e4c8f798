"""S3 plumbing shared by model inspection and weight download.

One aiobotocore client per PoolManager (its connection pool sized to the
download concurrency); botocore's own retries are off, `with_retries` retries
transient errors and throttling with capped exponential backoff and jitter.
"""
from __future__ import annotations

import asyncio
import random
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, TypeVar

from pool.api import S3Access
from pool.settings import PoolSettings

T = TypeVar("T")
S3Client = Any                       # an aiobotocore S3 client (the library has no type hints)

TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
    "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "503", "500",
})
MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound", "NoSuchBucket"})
MISMATCH_CODES = frozenset({"PreconditionFailed", "412"})
DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"})


@dataclass(frozen=True)
class S3Object:
    bucket: str
    key: str
    size: int
    etag: str                        # without quotes
    # Who it was read from: "" the platform's S3, else S3Access.origin. Part of the
    # cache key, so a tenant's own endpoint cannot pass its objects off as another's.
    origin: str = ""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def is_multipart_etag(self) -> bool:
        return "-" in self.etag


def origin_prefix(obj: S3Object) -> str:
    """What a cache key of obj starts with: nothing for the platform's own S3."""
    return f"{obj.origin}|" if obj.origin else ""


def parse_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/prefix/ -> (bucket, "prefix/") (prefix "" for the bucket root)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"model_uri: expected s3://bucket/prefix/, got {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"model_uri: no bucket in {uri!r}")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def longest_prefix(uri: str, prefixes: Iterable[str]) -> Optional[str]:
    """The longest of `prefixes` (each ending in "/") that `uri` lies under."""
    return max((prefix for prefix in prefixes if uri.startswith(prefix)), key=len, default=None)


def access_for(uri: str, grants: Mapping[str, S3Access]) -> Optional[S3Access]:
    """The access of the longest granted prefix `uri` lies under (None: the platform's)."""
    prefix = longest_prefix(uri, grants)
    return grants[prefix] if prefix is not None else None


def with_access(settings: PoolSettings, access: S3Access) -> PoolSettings:
    """`settings` reading S3 with `access` in place of the platform's credentials."""
    return replace(settings, s3_endpoint=access.endpoint_url or settings.s3_endpoint,
                   s3_region=access.region or settings.s3_region,
                   aws_access_key_id=access.access_key_id,
                   aws_secret_access_key=access.secret_access_key)


async def open_client(settings: PoolSettings, stack: AsyncExitStack) -> S3Client:
    """An aiobotocore S3 client that lives as long as `stack`."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(
        max_pool_connections=settings.download_concurrency + 8,
        connect_timeout=10, read_timeout=settings.s3_read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    return await stack.enter_async_context(get_session().create_client(
        "s3", endpoint_url=settings.s3_endpoint, region_name=settings.s3_region,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key, config=config))


def error_code(exc: BaseException) -> Optional[str]:
    response = _response(exc)
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(code or status or "") or None


def is_transient(exc: BaseException) -> bool:
    import aiohttp
    from botocore import exceptions as bx

    code = error_code(exc)
    if code is not None:
        status = _response(exc).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in TRANSIENT_CODES or status == 429 or status >= 500
    return isinstance(exc, (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError,
                            bx.ConnectionError, bx.HTTPClientError, bx.ReadTimeoutError,
                            ShortRead))


def _response(exc: BaseException) -> dict[str, Any]:
    """The parsed error response a botocore ClientError carries ({} for other errors)."""
    response = getattr(exc, "response", None)
    return response if isinstance(response, dict) else {}


class ShortRead(Exception):
    """A ranged GET returned fewer bytes than asked: retried."""


async def with_retries(call: Callable[[], Awaitable[T]], *, attempts: int, base_s: float,
                       cap_s: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> T:
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as exc:  # noqa: BLE001 - classified below
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            await sleep(backoff_s(attempt, base_s, cap_s))
    raise AssertionError("unreachable")


def backoff_s(attempt: int, base_s: float, cap_s: float) -> float:
    """Capped exponential backoff with equal jitter: [d/2, d], d = min(cap, base * 2^n)."""
    delay = min(cap_s, base_s * (2.0 ** attempt))
    return delay / 2 + random.random() * delay / 2


async def list_objects(client: S3Client, bucket: str, prefix: str) -> list[S3Object]:
    """Objects directly under `prefix` (no deeper folders)."""
    found: list[S3Object] = []
    paginator = client.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for item in page.get("Contents", []):
            if item["Key"] != prefix:
                found.append(S3Object(bucket, item["Key"], int(item["Size"]), item["ETag"].strip('"')))
    return found
