"""Asynchronous function calls (`/invoke?async=true`): kept in memory until `retention_s`
after they finish, read back by id by their own tenant only.

A pure store over a clock the caller passes: `start` makes a call id, `finish`
records the answer, `get` answers the tenant's own call (None for any other
tenant's, as for an unknown id) and drops what outlived its retention. A control
plane that restarts forgets its calls (the usage rows stay): a client that gets
404 for a call it made retries it.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

MAX_CALLS = 10_000


@dataclass
class StoredCall:
    id: str
    tenant_id: str
    deployment: str
    created: float
    status: str = "running"                # running | succeeded | failed
    finished: Optional[float] = None
    http_status: Optional[int] = None
    body: Optional[dict[str, Any]] = None

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"id": self.id, "object": "function.call", "function": self.deployment,
                                "status": self.status}
        if self.body is not None:
            view["http_status"] = self.http_status
            view.update(self.body)
        return view


class CallStoreFull(Exception):
    pass


class FunctionCalls:
    def __init__(self, retention_s: float, max_calls: int = MAX_CALLS):
        self.retention_s = retention_s
        self.max_calls = max_calls
        self._calls: dict[str, StoredCall] = {}

    def start(self, tenant_id: str, deployment: str, now: float) -> StoredCall:
        self._sweep(now)
        if len(self._calls) >= self.max_calls:
            raise CallStoreFull(f"{self.max_calls} asynchronous calls are held")
        call = StoredCall(f"call-{uuid.uuid4().hex}", tenant_id, deployment, now)
        self._calls[call.id] = call
        return call

    def finish(self, call_id: str, http_status: int, body: dict[str, Any], now: float) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.status = "succeeded" if http_status == 200 else "failed"
            call.http_status, call.body, call.finished = http_status, body, now

    def get(self, tenant_id: str, call_id: str, now: float) -> Optional[StoredCall]:
        self._sweep(now)
        call = self._calls.get(call_id)
        return call if call is not None and call.tenant_id == tenant_id else None

    def _sweep(self, now: float) -> None:
        expired = [c.id for c in self._calls.values()
                   if c.finished is not None and now - c.finished >= self.retention_s]
        for call_id in expired:
            del self._calls[call_id]
