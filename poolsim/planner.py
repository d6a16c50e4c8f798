"""The capacity planner: the smallest pool that meets a TTFT SLO on a trace, found by
simulation, with what it costs and how each deployment should scale.

For each GPU kind and each candidate policy, the node count is searched (bisection
between one node and `max_nodes`, starting from the textbook estimate's neighbourhood)
for the smallest pool whose simulated day meets the SLO: TTFT p99 within each model
size class's target, and at most `max_lost` of the requests refused or timed out.
The cheapest pool that meets it wins (the whole fleet for the trace's duration at the
kind's price; ties: the lower p99). Its simulation gives the GPU-hours replicas held,
and each deployment's recommended settings: max_replicas from the most it ran at once
(plus one), min_replicas 1 where a replica was up nearly all the time anyway, the
policy's idle and sleep timeouts, and the keep-alive window its idle times taught.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from poolsim.cluster import ClusterShape
from poolsim.outcome import Outcome
from poolsim.policies import PoolPolicy
from poolsim.replica_model import GpuKind
from poolsim.simulator import NeverFitsPool, SimSettings, simulate
from poolsim.textbook import TextbookEstimate, estimate
from poolsim.workload import Trace

ALWAYS_UP = 0.9           # a deployment with a replica up this share of the time keeps one


@dataclass(frozen=True)
class Slo:
    ttft_p99_s: Mapping[str, float]          # by size class (poolsim.simulator.size_class)
    max_lost: float = 0.001                  # refused or timed out, of all requests


@dataclass(frozen=True)
class Tried:
    kind: str
    policy: str
    nodes: int
    outcome: Outcome
    meets: bool


@dataclass(frozen=True)
class Recommendation:
    deployment: str
    min_replicas: int
    max_replicas: int
    idle_timeout_s: float
    sleep_timeout_s: float
    prewarm_s: Optional[float]
    keep_until_s: Optional[float]


@dataclass(frozen=True)
class Plan:
    best: Optional[Tried]
    tried: tuple[Tried, ...]
    textbook: Mapping[str, TextbookEstimate]          # by GPU kind
    recommendations: tuple[Recommendation, ...]
    unfit: Mapping[str, str]                          # GPU kinds some deployment never fits, and why

    @property
    def fleet_cost(self) -> Optional[float]:
        return self.best.outcome.fleet_cost if self.best else None


def meets(outcome: Outcome, slo: Slo) -> bool:
    lost = outcome.rejected + outcome.timed_out
    if lost > slo.max_lost * max(1, outcome.requests):
        return False
    return all(p99 <= slo.ttft_p99_s.get(cls, float("inf")) for cls, (_, p99) in outcome.ttft_by_class.items())


Simulate = Callable[[Trace, ClusterShape, PoolPolicy], Outcome]


def plan(trace: Trace, kinds: Sequence[GpuKind], policies: Sequence[PoolPolicy], slo: Slo,
         max_nodes: int = 64, settings: Optional[SimSettings] = None) -> Plan:
    def run(tr: Trace, shape: ClusterShape, pol: PoolPolicy) -> Outcome:
        return simulate(tr, shape, pol, settings or SimSettings())
    tried: list[Tried] = []
    unfit: dict[str, str] = {}
    textbook = {kind.name: estimate(trace, kind) for kind in kinds}
    for kind in kinds:
        try:
            for pol in policies:
                tried += smallest_pool(trace, kind, pol, slo, max_nodes, textbook[kind.name].nodes, run)
        except NeverFitsPool as exc:
            unfit[kind.name] = str(exc)
    meeting = [t for t in tried if t.meets]
    best = min(meeting, key=lambda t: (t.outcome.fleet_cost, t.outcome.ttft_p99_s), default=None)
    chosen = next((p for p in policies if best is not None and p.name == best.policy), None)
    recs = recommend(best.outcome, chosen, trace) if best is not None and chosen is not None else ()
    return Plan(best, tuple(tried), textbook, recs, unfit)


def smallest_pool(trace: Trace, kind: GpuKind, policy: PoolPolicy, slo: Slo, max_nodes: int,
                  guess: int, run: Simulate) -> list[Tried]:
    """Every pool tried for this kind and policy; the smallest that meets the SLO is the
    one with meets=True and the fewest nodes (none if even max_nodes does not)."""
    tried: list[Tried] = []

    def attempt(nodes: int) -> bool:
        outcome = run(trace, ClusterShape(nodes, kind), policy)
        tried.append(Tried(kind.name, policy.name, nodes, outcome, meets(outcome, slo)))
        return tried[-1].meets

    low, high = 1, min(max_nodes, max(1, guess))
    while not attempt(high):                 # grow from the estimate until it meets the SLO
        if high >= max_nodes:
            return tried
        low, high = high + 1, min(max_nodes, high * 2)
    while low < high:                        # then the smallest that still does
        mid = (low + high) // 2
        low, high = (low, mid) if attempt(mid) else (mid + 1, high)
    return tried


def recommend(outcome: Outcome, policy: PoolPolicy, trace: Trace) -> tuple[Recommendation, ...]:
    recs = []
    for dep in trace.deployments:
        stats = outcome.deployments.get(dep.name)
        if stats is None:
            continue
        cfg = policy.scaling(dep)
        up_share = stats.gpu_seconds / dep.model.gpu_count / max(1e-9, outcome.duration_s)
        recs.append(Recommendation(
            dep.name, min_replicas=max(cfg.min_replicas, 1 if up_share >= ALWAYS_UP else 0),
            max_replicas=max(1, stats.peak_replicas + 1), idle_timeout_s=cfg.idle_timeout_s,
            sleep_timeout_s=cfg.sleep_timeout_s, prewarm_s=stats.prewarm_s, keep_until_s=stats.until_s))
    return tuple(recs)
