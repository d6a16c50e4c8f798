"""Field validators shared by every body the control plane stores: each refusal is an
`InvalidField` naming the field (a 422 at the API).

Values end up in Postgres columns, so integers stay inside INTEGER, and text
holds no NUL and no lone surrogate (neither can be stored as UTF-8 text).
"""
from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from typing import AbstractSet, Any, Mapping, Optional

from controlplane.store.errors import InvalidField

MAX_INT = 2 ** 31 - 1          # INTEGER columns
MAX_BIGINT = 2 ** 63 - 1


def obj(name: str, value: Any, allowed: Optional[AbstractSet[str]]) -> dict[str, Any]:
    """A JSON object whose keys are all in `allowed` (None: any keys)."""
    if not isinstance(value, dict):
        raise InvalidField(name, "must be a JSON object")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            prefix = "" if name == "body" else f"{name}."
            raise InvalidField(f"{prefix}{unknown[0]}", "unknown field")
    return value


def integer(name: str, value: Any, minimum: int, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(name, "must be an integer")
    if value < minimum:
        raise InvalidField(name, f"must be >= {minimum}")
    if value > maximum:
        raise InvalidField(name, f"must be <= {maximum}")
    return value


def optional_integer(name: str, value: Any, minimum: int, maximum: int = MAX_INT) -> Optional[int]:
    return None if value is None else integer(name, value, minimum, maximum)


def number(name: str, value: Any, minimum: float, exclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidField(name, "must be a number")
    if value < minimum or (exclusive and value == minimum):
        raise InvalidField(name, f"must be {'>' if exclusive else '>='} {minimum}")
    return float(value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidField(name, "must be true or false")
    return value


def text(name: str, value: Any, max_length: int = 200) -> str:
    if not isinstance(value, str):
        raise InvalidField(name, "must be a string")
    if len(value) > max_length:
        raise InvalidField(name, f"at most {max_length} characters")
    return storable(name, value)


def storable(name: str, value: str) -> str:
    """Text Postgres can store: no NUL, valid UTF-8 (no lone surrogates)."""
    if "\x00" in value or not _encodes(value):
        raise InvalidField(name, "must not hold NUL or unpaired surrogate characters")
    return value


def storable_json(name: str, value: Any) -> Any:
    """Every key and string inside a JSON value is storable text (for JSONB columns)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            storable(name, item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


def timestamp(name: str, value: Any) -> datetime:
    """An ISO 8601 time; UTC when it names no offset."""
    if not isinstance(value, str):
        raise InvalidField(name, "must be an ISO 8601 time")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).astimezone(
            timezone.utc)
    except (ValueError, OverflowError):
        raise InvalidField(name, "must be an ISO 8601 time") from None


def effective_from(body: Mapping[str, Any], now: datetime, why: str) -> datetime:
    """A book's new row takes effect at `effective_from`, now when absent, never in the
    past (`why`: what a row in the past would rewrite)."""
    if body.get("effective_from") is None:
        return now
    when = timestamp("effective_from", body["effective_from"])
    if when < now:
        raise InvalidField("effective_from", f"must not be in the past: {why}")
    return when


def _encodes(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_uuid(value: str) -> bool:
    """Ids in paths are uuids; anything else is simply not found (never a database error)."""
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
