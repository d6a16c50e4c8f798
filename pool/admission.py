"""Which replicas waiting for slots get them now: fair across tenants, within their quotas.

A pure decision over a snapshot: the replicas waiting to be placed (each with
its tenant and its arrival number), the slots as placement sees them, the
GPUs each tenant holds (slots reserved by its live replicas, starting ones
included) and each tenant's quota. No clock, no I/O.

  quota     a replica that would take its tenant past `quota.max_gpus` is not
            placed: it waits for its own tenant's replicas to stop. Nothing is
            ever taken from another tenant (no preemption).
  order     the tenant holding the fewest GPUs goes first, then the oldest
            arrival; after each grant the order is taken again, so tenants
            waiting together are served in turn and one tenant's burst of
            pending replicas cannot starve another's.
  backfill  a replica that does not fit the free slots now is passed over for
            the next in order that does (a large replica then waits for a hole
            of its size; replicas held forever, e.g. min_replicas, cannot make
            it block everyone behind it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Mapping, Optional, Sequence

from pool.api import TenantQuota
from pool.placement import NoCapacity, Placed, PlacementRequest, SlotState, place


@dataclass(frozen=True)
class Pending:
    """A replica waiting for slots."""
    replica_id: str
    tenant_id: str
    request: PlacementRequest
    seq: int                                   # arrival order: lower waited longer
    prefer_nodes: Collection[str] = frozenset()

    @property
    def gpus(self) -> int:
        return self.request.slot_count


@dataclass(frozen=True)
class WaitReason:
    """Why a pending replica was not placed."""
    reason: str
    over_quota: bool = False                   # True: its tenant's quota, not the pool, holds it back


@dataclass(frozen=True)
class SlotGrants:
    placed: tuple[tuple[str, Placed], ...]     # (replica_id, where), in the order granted
    waiting: Mapping[str, WaitReason]             # every pending replica not placed


def admit(pending: Sequence[Pending], slots: Sequence[SlotState], held: Mapping[str, int],
          quotas: Mapping[str, TenantQuota]) -> SlotGrants:
    """Grant slots, one replica at a time, in the fair order, while any fits."""
    left = sorted(pending, key=lambda p: p.seq)
    free, holding = list(slots), dict(held)
    placed: list[tuple[str, Placed]] = []
    while (grant := next_grant(left, free, holding, quotas)) is not None:
        chosen, where = grant
        placed.append((chosen.replica_id, where))
        left.remove(chosen)
        free = reserve(free, where, chosen.request.load)
        holding[chosen.tenant_id] = holding.get(chosen.tenant_id, 0) + chosen.gpus
    waiting = {p.replica_id: why_waiting(p, free, holding, quotas) for p in left}
    return SlotGrants(tuple(placed), waiting)


def next_grant(pending: Sequence[Pending], slots: Sequence[SlotState], held: Mapping[str, int],
               quotas: Mapping[str, TenantQuota]) -> Optional[tuple[Pending, Placed]]:
    """The first replica in fair order that its quota allows and the slots can take."""
    for candidate in fair_order(pending, held):
        if over_quota(candidate, held, quotas):
            continue
        decision = place(candidate.request, slots, candidate.prefer_nodes)
        if isinstance(decision, Placed):
            return candidate, decision
    return None


def fair_order(pending: Sequence[Pending], held: Mapping[str, int]) -> list[Pending]:
    """Fewest GPUs held by the tenant first, then the longest waiting."""
    return sorted(pending, key=lambda p: (held.get(p.tenant_id, 0), p.seq))


def over_quota(candidate: Pending, held: Mapping[str, int], quotas: Mapping[str, TenantQuota]) -> bool:
    limit = quotas.get(candidate.tenant_id, TenantQuota()).max_gpus
    return limit is not None and held.get(candidate.tenant_id, 0) + candidate.gpus > limit


def why_waiting(candidate: Pending, slots: Sequence[SlotState], held: Mapping[str, int],
                quotas: Mapping[str, TenantQuota]) -> WaitReason:
    if over_quota(candidate, held, quotas):
        limit = quotas[candidate.tenant_id].max_gpus
        return WaitReason(f"waiting for GPU quota: tenant {candidate.tenant_id} holds "
                       f"{held.get(candidate.tenant_id, 0)} of its {limit} GPU(s) and this replica "
                       f"needs {candidate.gpus}", over_quota=True)
    decision = place(candidate.request, slots, candidate.prefer_nodes)   # NoCapacity: admit() placed all that fit
    return WaitReason(decision.reason if isinstance(decision, NoCapacity) else "waiting for capacity")


def reserve(slots: Sequence[SlotState], where: Placed, load: float = 0.0) -> list[SlotState]:
    """The slots after `where` was reserved (an exclusive slot is then full), with the
    replica's expected load added."""
    def taken(s: SlotState) -> SlotState:
        reserved = s.memory_bytes if s.exclusive else s.reserved_bytes + where.bytes_per_slot
        return replace(s, reserved_bytes=reserved, load=s.load + load)
    return [taken(s) if s.slot_id in where.slot_ids else s for s in slots]


def never_within_quota(gpus: int, quota: TenantQuota) -> Optional[str]:
    """Why a replica of `gpus` GPUs could never be placed under this quota, or None."""
    if quota.max_gpus is not None and gpus > quota.max_gpus:
        return f"needs {gpus} GPU(s); the tenant's quota is {quota.max_gpus}"
    return None


def queue_refusal(tenant_id: str, queued: int, quota: TenantQuota) -> Optional[str]:
    """Why one more waiting request of this tenant is refused (QueueFull), or None."""
    limit = quota.max_queued_requests
    if limit is not None and queued >= limit:
        return f"tenant {tenant_id}: {queued} requests already wait for replicas (quota {limit})"
    return None
