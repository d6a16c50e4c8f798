"""The signature of a webhook delivery, Stripe-style, and its check for receivers.

A delivery carries `Thawpool-Signature: t=<unix seconds>,v1=<hex>` where the hex is
HMAC-SHA256 with the endpoint's secret over `t + "." + body` (the raw bytes as sent).
The timestamp is signed so that a captured delivery cannot be replayed after
`tolerance_s`; a receiver compares in constant time and accepts any `v1` that matches
(several appear while a secret is being rotated). Standard library only, so a receiver
may copy this module as it is.
"""
from __future__ import annotations

import hashlib
import hmac
import time
from typing import Optional

SIGNATURE_HEADER = "Thawpool-Signature"
EVENT_ID_HEADER = "Thawpool-Event-Id"
EVENT_TYPE_HEADER = "Thawpool-Event-Type"
DEFAULT_TOLERANCE_S = 300.0


class SignatureError(ValueError):
    """The header is malformed, no signature matches, or the timestamp is too old."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The header's value for `body` sent at `timestamp`."""
    return f"t={timestamp},v1={signature(secret, timestamp, body)}"


def verify(secret: str, header: str, body: bytes, tolerance_s: float = DEFAULT_TOLERANCE_S,
           now: Optional[float] = None) -> int:
    """The signed timestamp when `header` signs `body` with `secret` within `tolerance_s`
    of `now` (default: the clock); SignatureError otherwise."""
    timestamp, candidates = _parse(header)
    expected = signature(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, given) for given in candidates):
        raise SignatureError("no v1 signature matches the body")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError(f"timestamp {timestamp} is outside the tolerance of {tolerance_s}s")
    return timestamp


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: Optional[int] = None
    candidates = []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError("expected t=<unix seconds>,v1=<hex>")
    return timestamp, candidates
