"""Why a request is refused at once instead of waiting for a replica: each a pure
function of the revision's books, returning the error the pool raises (or None)."""
from __future__ import annotations

from typing import Optional

from pool.admission import queue_refusal
from pool.api import ColdStartFailed, QueueFull, QuotaExceeded
from pool.backoff import refusing_for_s
from pool.registry import Registry, RevisionState, waits
from pool.replica import LIVE


def backoff_refusal(rev: RevisionState, now: float) -> Optional[ColdStartFailed]:
    """Right after a failed cold start, the answer at once, with its reason (503)."""
    refusing = refusing_for_s(rev.backoff, now)
    if rev.last_error and refusing is not None and not rev.in_state(*LIVE):
        return ColdStartFailed(rev.last_error, retry_after_s=max(0.5, refusing))
    return None


def queue_refusal_for(registry: Registry, rev: RevisionState) -> Optional[QueueFull]:
    """429 at once when the tenant already has quota.max_queued_requests waiting."""
    tenant = rev.spec.tenant_id
    reason = queue_refusal(tenant, registry.queued_requests(tenant), rev.spec.quota)
    return QueueFull(reason, retry_after_s=1.0) if reason else None


def gpu_quota_refusal(rev: RevisionState) -> Optional[QuotaExceeded]:
    """After a wait that timed out: 429 if the tenant's GPU quota, not the pool, held the
    revision's next replica back (the replica keeps waiting for the tenant's own to stop)."""
    held_back = [w for w in waits(rev) if w.over_quota]
    return QuotaExceeded(f"revision {rev.spec.revision_id}: {held_back[0].reason}") if held_back else None
