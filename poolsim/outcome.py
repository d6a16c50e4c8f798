"""What a simulation measured: time to first token, cold starts by tier, GPU time
and what it cost, and the requests that never got an answer."""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

TIERS = ("warm", "wake", "standby", "cache", "s3")


@dataclass
class DeploymentStats:
    """One deployment's share of a simulation (what the planner's recommendations read)."""
    requests: int = 0
    cold_starts: int = 0             # wakes included
    gpu_seconds: float = 0.0
    peak_replicas: int = 0
    prewarm_s: Optional[float] = None      # its learned keep-alive window at the end, if any
    until_s: Optional[float] = None


@dataclass
class Tally:
    """Counted while the simulation runs."""
    ttft: "array[float]" = field(default_factory=lambda: array("d"))      # seconds, per answered request
    ttft_by_class: "dict[str, array[float]]" = field(default_factory=dict)
    served_by_tier: dict[str, int] = field(default_factory=lambda: {t: 0 for t in TIERS})
    cold_starts: dict[str, int] = field(default_factory=lambda: {t: 0 for t in TIERS if t != "warm"})
    gpu_seconds: float = 0.0           # slots held by replicas (what a bill of GPU time counts)
    occupied_gpu_seconds: float = 0.0  # GPUs with a replica on them: the pool's footprint
    within_slo: int = 0                # answered within their deployment's TTFT target
    busy_gpu_seconds: float = 0.0      # ... while the replica ran requests
    timed_out: int = 0
    rejected: int = 0
    output_tokens: int = 0
    peak_gpus: int = 0
    prefetches: int = 0                # weights pulled ahead of a predicted call
    deployments: dict[str, DeploymentStats] = field(default_factory=dict)

    def answered(self, ttft_s: float, size_class: str, tier: str, slo_s: float) -> None:
        self.ttft.append(ttft_s)
        self.within_slo += ttft_s <= slo_s
        by_class = self.ttft_by_class.get(size_class)
        if by_class is None:
            by_class = self.ttft_by_class[size_class] = array("d")
        by_class.append(ttft_s)
        self.served_by_tier[tier] += 1


@dataclass(frozen=True)
class Outcome:
    policy: str
    duration_s: float
    gpus: int
    price_per_gpu_hour: float
    requests: int
    answered: int
    timed_out: int
    rejected: int
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_by_class: dict[str, tuple[float, float]]    # size class -> (p50, p99)
    cold_starts: dict[str, int]
    served_by_tier: dict[str, int]
    gpu_seconds: float
    busy_gpu_seconds: float
    peak_gpus: int
    output_tokens: int
    events: int
    wall_s: float
    deployments: dict[str, DeploymentStats] = field(default_factory=dict)
    prefetches: int = 0
    occupied_gpu_seconds: float = 0.0
    within_slo: int = 0

    @property
    def slo_attainment(self) -> float:
        """Requests answered within their TTFT target, of all requests (lost ones miss it)."""
        return self.within_slo / max(1, self.requests)

    @property
    def cold_share(self) -> float:
        """Requests that waited for a cold start or a wake, of those answered."""
        return 1.0 - self.served_by_tier.get("warm", 0) / max(1, self.answered)

    @property
    def idle_share(self) -> float:
        """GPU time replicas held while running no request."""
        return 1.0 - self.busy_gpu_seconds / self.gpu_seconds if self.gpu_seconds else 0.0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def occupied_gpu_hours(self) -> float:
        return self.occupied_gpu_seconds / 3600.0

    @property
    def cost(self) -> float:
        """The GPUs occupied, at the kind's price: what serving cost (GPUs no replica held
        could serve other work, or be given back)."""
        return self.occupied_gpu_hours * self.price_per_gpu_hour

    @property
    def fleet_cost(self) -> float:
        """Every GPU of the cluster for the whole trace."""
        return self.gpus * self.duration_s / 3600.0 * self.price_per_gpu_hour

    def to_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in self.__dict__.items() if k != "deployments"}
        return fields | {"gpu_hours": self.gpu_hours, "cost": self.cost, "slo_attainment": self.slo_attainment,
                         "cold_share": self.cold_share, "idle_share": self.idle_share}


def percentiles(samples: "array[float]") -> tuple[float, float]:
    if not samples:
        return (float("nan"), float("nan"))
    values = np.frombuffer(samples, dtype=np.float64)
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99)


def finish(tally: Tally, *, policy: str, duration_s: float, gpus: int, price: float, requests: int,
           events: int, wall_s: float, p_override: Optional[tuple[float, float]] = None) -> Outcome:
    p50, p99 = p_override or percentiles(tally.ttft)
    return Outcome(policy, duration_s, gpus, price, requests, len(tally.ttft), tally.timed_out, tally.rejected,
                   p50, p99, {k: percentiles(v) for k, v in sorted(tally.ttft_by_class.items())},
                   dict(tally.cold_starts), dict(tally.served_by_tier), tally.gpu_seconds,
                   tally.busy_gpu_seconds, tally.peak_gpus, tally.output_tokens, events, wall_s,
                   dict(tally.deployments), tally.prefetches, tally.occupied_gpu_seconds, tally.within_slo)
