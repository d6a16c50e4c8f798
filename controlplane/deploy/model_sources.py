"""Where a tenant may deploy from: pure rules over S3 URIs, no I/O.

Each tenant may read models under its own prefix of the platform's models
bucket, `s3://<models bucket>/tenants/<tenant id>/` (where its uploads land), and
under the prefixes an admin granted it or every tenant (a shared catalogue). The
`tenants/` namespace belongs to uploads alone: its folders are named by the
server-made tenant id, never by a name a tenant or an admin chose, and no grant may
overlap it, so no grant can hand one tenant's uploads to another or let a tenant's
uploads land in a shared catalogue. A URI outside them is refused
with one message, the same whether or not anything exists there, before any S3
request is made. URIs are compared as written, segment by segment: `.`, `..`
and empty segments are refused outright, so no spelling of another prefix can
pass as one of the tenant's.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from controlplane.store.errors import Forbidden, InvalidField

BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
SEGMENT = re.compile(r"^[^\x00-\x1f\x7f\s/\\]{1,255}$")
DENIED = ("not under a model source this tenant may deploy from "
          "(GET /v1/models/sources lists them)")
MAX_URI = 1024


TENANTS = "tenants"            # the models bucket's folder of tenants' own prefixes


def own_key_prefix(tenant_id: str) -> str:
    """The object keys of the tenant's own prefix start with this."""
    return f"{TENANTS}/{tenant_id}/"


def own_prefix(models_bucket: str, tenant_id: str) -> str:
    return f"s3://{models_bucket}/{own_key_prefix(tenant_id)}"


def check_grantable(prefix: str, models_bucket: str) -> None:
    """A grant (parsed by parse_s3_uri) may not reach into the tenants' namespace, nor
    contain it (the models bucket's root)."""
    namespace = f"s3://{models_bucket}/{TENANTS}/"
    if is_under(prefix, namespace) or is_under(namespace, prefix):
        raise InvalidField("prefix", f"overlaps {namespace}, where tenants' own uploads live; "
                                     "grant a prefix outside it")


def parse_s3_uri(field: str, value: Any, *, bucket_root: bool = False) -> str:
    """`s3://bucket/a/b/` as written, ending in "/" (a folder or a prefix); the bucket
    alone only when `bucket_root`. InvalidField naming `field` otherwise."""
    shape = "s3://bucket/prefix/" + (" or s3://bucket/" if bucket_root else "")
    if not isinstance(value, str) or not value.startswith("s3://") or len(value) > MAX_URI:
        raise InvalidField(field, f"must look like {shape}")
    bucket, _, path = value[len("s3://"):].partition("/")
    segments = path.rstrip("/").split("/") if path.rstrip("/") else []
    if not BUCKET.match(bucket) or (not segments and not bucket_root):
        raise InvalidField(field, f"must look like {shape}")
    for segment in segments:
        if segment in (".", "..") or not SEGMENT.match(segment):
            raise InvalidField(field, "each path segment must be a plain, non-empty name "
                                      "(no '.', '..', '//' or control characters)")
    return f"s3://{bucket}/" + "".join(f"{s}/" for s in segments)


def is_under(uri: str, prefix: str) -> bool:
    """Both parsed by parse_s3_uri, so both end in "/" and a prefix match is a folder match."""
    return uri.startswith(prefix)


def check_source(field: str, uri: str, prefixes: Iterable[str]) -> None:
    """Forbidden (403) unless `uri` lies under one of `prefixes`."""
    if not any(is_under(uri, prefix) for prefix in prefixes):
        raise Forbidden(field, DENIED, code="model_source_denied")
