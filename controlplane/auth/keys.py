"""API keys: a visible prefix and a high-entropy secret, stored as sha256."""
from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Union

SCOPES = frozenset({"deploy", "invoke", "billing:read", "admin"})
KEY_PREFIX = "tp_"
KEY_PREFIX_SHAPE = re.compile(r"^tp_[0-9a-f]{8}$")        # what generate_key shows
SECRET_BYTES = 32
# what generate_key mints: the prefix, "_", then token_urlsafe(SECRET_BYTES)'s 43 characters
KEY_SHAPE = re.compile(r"tp_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class NewKey:
    secret: str      # shown once, never stored
    prefix: str      # stored and shown, e.g. tp_3f9a1c2b
    key_hash: str    # sha256 hex of the whole secret


def generate_key() -> NewKey:
    visible = secrets.token_hex(4)
    secret = f"{KEY_PREFIX}{visible}_{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewKey(secret=secret, prefix=f"{KEY_PREFIX}{visible}", key_hash=hash_key(secret))


def is_key_shaped(secret: str) -> bool:
    """Whether `secret` could be a key generate_key minted: anything else is refused
    without a database read."""
    return KEY_SHAPE.fullmatch(secret) is not None


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_scopes(value: Union[str, Iterable[Any]]) -> list[str]:
    """A list or comma string of scopes; ValueError naming an unknown one."""
    if not isinstance(value, (str, list, tuple, set, frozenset)):
        raise ValueError("scopes: a list of scope names or a comma string")
    items = value.split(",") if isinstance(value, str) else list(value)
    scopes = sorted({str(s).strip() for s in items if str(s).strip()})
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(f"scopes: unknown or empty {unknown or scopes}; "
                         f"choose from {sorted(SCOPES)}")
    return scopes
