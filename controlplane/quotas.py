"""Per-tenant quotas as plain data and the static checks a deploy or patch must pass.

A tenant's `Quota` is the settings default with the admin's overrides on top
(None: no limit). Requests and tokens per minute over all its keys are enforced by
the gateway's rate limiter (controlplane.gateway.ratelimit). Deployments, replicas per
deployment, GPUs a deployment could hold at its maximum and GPUs its minimum keeps held are checked here, at deploy
time (422 naming the limit); GPUs held at once and queued requests travel to
the pool in `RevisionSpec.quota`, which enforces them while running. Asynchronous
calls in flight are counted by controlplane.gateway.async_calls (429 with Retry-After past
`max_async_calls`). `egress` is a grant rather than a limit: the hosts the tenant's
function servers may reach (none by default), which the pool's sandbox opens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Optional

from controlplane.store.errors import StaticQuotaExceeded
from pool.api import TenantQuota
from pool.egress import parse_host

MAX_EGRESS_HOSTS = 32


@dataclass(frozen=True)
class Quota:
    max_gpus: Optional[int] = None
    max_replicas_per_deployment: Optional[int] = None
    max_deployments: Optional[int] = None
    max_queued_requests: Optional[int] = None
    max_upload_bytes: Optional[int] = None
    requests_per_min: Optional[int] = None      # over all the tenant's keys (each key has its own too)
    tokens_per_min: Optional[int] = None
    max_async_calls: Optional[int] = None       # `/invoke?async=true` calls running at once
    # a grant more than a limit: "host:port" its function servers may reach (pool/egress.py)
    egress: Optional[tuple[str, ...]] = None

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Quota":
        """The admin's overrides (a None override keeps the default)."""
        given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                 for k, v in overrides.items() if v is not None}
        return replace(self, **given)

    def for_pool(self) -> TenantQuota:
        return TenantQuota(max_gpus=self.max_gpus, max_queued_requests=self.max_queued_requests,
                           egress=tuple(self.egress or ()))

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def egress_hosts(value: Any) -> Optional[list[str]]:
    """An admin's egress grant: null, or up to MAX_EGRESS_HOSTS "host:port" strings
    (normalised); ValueError naming the first it cannot take."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_EGRESS_HOSTS:
        raise ValueError(f"a list of at most {MAX_EGRESS_HOSTS} \"host:port\" strings")
    hosts = []
    for entry in value:
        if not isinstance(entry, str):
            raise ValueError("each entry is a \"host:port\" string")
        host, port = parse_host(entry)          # ValueError names the entry
        hosts.append(f"{host}:{port}")
    return sorted(set(hosts))


LIMITS = tuple(Quota.__dataclass_fields__)


@dataclass(frozen=True)
class DeploymentShape:
    """What one deployment would hold after the change being checked."""
    min_replicas: int
    max_replicas: int
    gpu_counts: tuple[int, ...]      # of each revision that takes traffic

    @property
    def widest_gpus(self) -> int:
        """GPUs one revision holds at max_replicas."""
        return max(self.gpu_counts, default=0) * self.max_replicas

    @property
    def reserved_gpus(self) -> int:
        """GPUs its min_replicas keep held: each revision taking traffic keeps that many."""
        return self.min_replicas * sum(self.gpu_counts)


@dataclass(frozen=True)
class TenantHoldings:
    """What the tenant's other deployments hold (the one being checked left out)."""
    deployments: int
    reserved_gpus: int


def check_deployment(quota: Quota, shape: DeploymentShape, others: TenantHoldings,
                     before: Optional[DeploymentShape]) -> None:
    """QuotaExceeded naming the first limit the deployment would pass. `before` is the
    deployment as it stands (None: a new one): a change is refused only where it goes
    past a limit or further past one, so a tenant over a lowered quota can still shrink."""
    if before is None and _over(others.deployments + 1, quota.max_deployments):
        raise StaticQuotaExceeded("max_deployments",
                            f"this tenant may hold {quota.max_deployments} deployments")
    old = before or DeploymentShape(0, 0, ())
    if _worse(shape.max_replicas, old.max_replicas, quota.max_replicas_per_deployment):
        raise StaticQuotaExceeded("max_replicas_per_deployment",
                            f"scaling.max_replicas {shape.max_replicas} is above this tenant's "
                            f"limit of {quota.max_replicas_per_deployment}")
    if _worse(shape.widest_gpus, old.widest_gpus, quota.max_gpus):
        raise StaticQuotaExceeded("max_gpus",
                            f"resources.gpu_count x scaling.max_replicas = {shape.widest_gpus} "
                            f"GPUs, above this tenant's limit of {quota.max_gpus} held at once")
    reserved = others.reserved_gpus + shape.reserved_gpus
    if _worse(reserved, others.reserved_gpus + old.reserved_gpus, quota.max_gpus):
        raise StaticQuotaExceeded("max_gpus",
                            f"scaling.min_replicas would keep {reserved} GPUs held with the "
                            f"tenant's other deployments, above its limit of {quota.max_gpus}")


def check_upload(quota: Quota, used_bytes: int, adding_bytes: int) -> None:
    if _over(used_bytes + adding_bytes, quota.max_upload_bytes):
        raise StaticQuotaExceeded("max_upload_bytes",
                            f"{adding_bytes} more bytes would take this tenant's uploads past "
                            f"its limit of {quota.max_upload_bytes} bytes "
                            f"({used_bytes} used)")


def _over(value: int, limit: Optional[int]) -> bool:
    return limit is not None and value > limit


def _worse(value: int, before: int, limit: Optional[int]) -> bool:
    """Past the limit, and more than before."""
    return _over(value, limit) and value > before
