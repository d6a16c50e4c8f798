"""Asynchronous function calls (`/invoke?async=true`): what a tenant may rely on, decided
over a `now` the caller passes (no database and no clock here).

A call is accepted `running` and answered once it ends (`succeeded` for the function's
200, else `failed`, with the status and JSON body a synchronous call would have had).
Its tenant reads it by id until `retention_s` after it ended; any other tenant's id is
not found, exactly like an unknown one. A running call never expires: it ends, or the
control plane that ran it died and the next one to start marks it failed with
`cut_by_restart`'s answer, which tells the client to invoke again. The calls live in
Postgres (controlplane/store/function_calls.py); controlplane/gateway/async_calls.py runs them.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Optional

from wire.errors import error_body

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"
CALL_ID = re.compile(r"call-[0-9a-f]{32}")
RESTARTED = "control_plane_restarted"


@dataclass(frozen=True)
class StoredCall:
    id: str
    tenant_id: str
    deployment: str
    created_at: datetime
    status: str = RUNNING
    finished_at: Optional[datetime] = None
    http_status: Optional[int] = None
    body: Optional[dict[str, Any]] = None

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"id": self.id, "object": "function.call", "function": self.deployment,
                                "status": self.status}
        if self.body is not None:
            view["http_status"] = self.http_status
            view.update(self.body)
        return view


@dataclass(frozen=True)
class SweepState:
    """When expired calls were last deleted, and whether that sweep had to stop at its
    bound (then more wait, and the next chance sweeps again)."""
    last_at: Optional[datetime] = None
    full: bool = False


def new_call(tenant_id: str, deployment: str, now: datetime) -> StoredCall:
    return StoredCall(f"call-{uuid.uuid4().hex}", tenant_id, deployment, now)


def is_call_id(text: str) -> bool:
    """Anything else is simply not found: it never reaches the database."""
    return CALL_ID.fullmatch(text) is not None


def finished(call: StoredCall, http_status: int, body: dict[str, Any], now: datetime) -> StoredCall:
    status = SUCCEEDED if http_status == 200 else FAILED
    return replace(call, status=status, finished_at=now, http_status=http_status, body=body)


def expired_before(now: datetime, retention_s: float) -> datetime:
    """Calls that ended at or before this are gone (reads and the sweep agree on it)."""
    return now - timedelta(seconds=retention_s)


def is_expired(call: StoredCall, now: datetime, retention_s: float) -> bool:
    return call.finished_at is not None and call.finished_at <= expired_before(now, retention_s)


def sweep_due(state: SweepState, now: datetime, every_s: float) -> bool:
    return state.full or state.last_at is None or (now - state.last_at).total_seconds() >= every_s


def cut_by_restart() -> tuple[int, dict[str, Any]]:
    """The answer of a call its control plane did not live to finish: retryable, as a 503.
    Whether the function ran is unknown, so the client decides whether to call again."""
    return 503, error_body("the control plane restarted while this call ran and its result was "
                           "lost; invoke the function again", 503, code=RESTARTED)
