"""What each pool being compared does with a deployment: its scaling settings and
the mechanisms it has (a node cache of weights, warm standby processes, a sleep tier).

The comparison runs every policy on the same simulator and the same trace; only
these settings differ. The baselines are configured as their users run them:

  always-warm   one replica per deployment at all times (min_replicas 1): no
                cold start after the first; each on whole GPUs of its own, as a
                vLLM server takes 90% of a GPU's memory by default
  knative       KServe's default scale to zero on Knative: the pod goes 60 s
                (the stable window) + 30 s (scale-to-zero grace) after the last
                request; every pod's storage initializer downloads the model
                (no node cache, no standby, no sleep); a pod a GPU (Kubernetes
                does not share a GPU between pods by default)
  thawpool      the pool's own defaults: idle timeout 300 s, the sleep tier
                (idle replicas sleep in host memory for 30 min before they
                stop), one warm standby process a node, weights kept in the
                node's cache
  thawpool-60s  the same with a 60 s idle timeout: with a sleep tier a short one pays,
                since the next call wakes a sleeper in about a second instead of a
                cold start
  thawpool-learned  thawpool-60s with keep-alive and pre-warm windows learned from each
                deployment's own idle times (pool/keep_alive.py; the pool's
                keep_alive = "learned")
  thawpool-packed  thawpool-learned with placement told each replica's expected
                load (its deployment's recent work over its replicas), so busy
                replicas do not share a GPU (pool/placement.py)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from pool.autoscaler import ScalingConfig
from poolsim.workload import Deployment


class PoolPolicy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def node_cache(self) -> bool:
        """Weights stay in a node's cache after a replica stops."""
        ...

    @property
    def standbys_per_node(self) -> int:
        """Warm runtime processes waiting for a model on each node."""
        ...

    @property
    def learned_keep_alive(self) -> bool:
        """pool/keep_alive.py's windows (PoolSettings.keep_alive "learned")."""
        ...

    @property
    def exclusive_gpus(self) -> bool:
        """Each replica takes whole GPUs, as vLLM does (90% of a GPU's memory by default)."""
        ...

    @property
    def pack_by_load(self) -> bool:
        """Placement is told each replica's expected load (pool/placement.py)."""
        ...

    def scaling(self, dep: Deployment) -> ScalingConfig:
        """The autoscaler's settings for this deployment (pool.autoscaler)."""
        ...


@dataclass(frozen=True)
class StaticPolicy:
    name: str
    base: ScalingConfig
    node_cache: bool = True
    standbys_per_node: int = 0
    learned_keep_alive: bool = False
    pack_by_load: bool = False
    exclusive_gpus: bool = False

    def scaling(self, dep: Deployment) -> ScalingConfig:
        return self.base


MAX_REPLICAS = 64
TARGET_CONCURRENCY = 32          # requests in flight a replica is sized for


def always_warm() -> StaticPolicy:
    return StaticPolicy("always-warm", ScalingConfig(min_replicas=1, max_replicas=MAX_REPLICAS,
                                                     target_concurrency=TARGET_CONCURRENCY),
                        node_cache=True, exclusive_gpus=True)


def knative() -> StaticPolicy:
    return StaticPolicy("knative", ScalingConfig(max_replicas=MAX_REPLICAS, target_concurrency=TARGET_CONCURRENCY,
                                                 idle_timeout_s=90.0, scale_down_delay_s=60.0),
                        node_cache=False, exclusive_gpus=True)


def thawpool() -> StaticPolicy:
    return StaticPolicy("thawpool", ScalingConfig(max_replicas=MAX_REPLICAS, target_concurrency=TARGET_CONCURRENCY,
                                                  idle_timeout_s=300.0, sleep_timeout_s=1800.0),
                        node_cache=True, standbys_per_node=1)


def thawpool_60s() -> StaticPolicy:
    return replace(with_idle(thawpool(), 60.0), name="thawpool-60s")


def thawpool_learned() -> StaticPolicy:
    return replace(thawpool_60s(), name="thawpool-learned", learned_keep_alive=True)


def thawpool_packed() -> StaticPolicy:
    return replace(thawpool_learned(), name="thawpool-packed", pack_by_load=True)


BASELINES = {"always-warm": always_warm, "knative": knative, "thawpool": thawpool,
             "thawpool-60s": thawpool_60s, "thawpool-learned": thawpool_learned,
             "thawpool-packed": thawpool_packed}


def with_idle(policy: StaticPolicy, idle_timeout_s: float) -> StaticPolicy:
    return replace(policy, base=replace(policy.base, idle_timeout_s=idle_timeout_s))
