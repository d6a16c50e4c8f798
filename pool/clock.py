"""The pool's two clocks, injected so that tests can step time.

Monotonic seconds measure durations (timeouts, idle time, backoff); UTC
datetimes stamp replica events, which bill GPU seconds.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone


class Clock:
    def mono(self) -> float:
        return time.monotonic()

    def utc(self) -> datetime:
        return datetime.now(timezone.utc)
