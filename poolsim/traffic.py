"""Azure-shaped synthetic traffic: generate(config) -> Trace.

A trace is planned, then streamed. The plan gives each deployment a tenant,
a model from the catalogue (poolsim.catalogue: sizes, mix, tensor
parallelism), a kind (chat or code), a mean rate and a burstiness
(poolsim.popularity: Azure Functions' heavy-tailed rates and inter-arrival
CVs). The stream runs each deployment's Gamma renewal process on the diurnal
clock (poolsim.arrivals), draws each request's lengths for its kind
(poolsim.lengths: the Azure LLM inference traces) and merges the deployments
in time order (poolsim.streams).

Everything is drawn from numpy generators seeded by (seed, what): the plan
from one, each deployment's requests from their own (seeded by its index),
so a trace is the same every time it is streamed, whatever order the merge
pulls the deployments in. Tenants own deployments by Zipf's law (tenant j
in proportion to 1 / (j + 1)): a few tenants hold many deployments, most
hold one or two; no published figure, an assumption.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Iterator, Optional

import numpy as np

from poolsim.arrivals import Diurnal, arrival_times
from poolsim.catalogue import CATALOGUE, CatalogueEntry, model_shape, size_mix
from poolsim.lengths import CHAT, CODE, LengthModel, draw_lengths
from poolsim.popularity import burst_cvs, rates_per_s
from poolsim.streams import Chunk, merge
from poolsim.workload import Deployment, Kind, Request, Trace

_PLAN, _ARRIVALS = 0, 1              # the second word of a generator's seed: what it draws


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    deployments: int = 200
    tenants: int = 50
    duration_s: float = 86_400.0
    seed: int = 0
    rate_scale: float = 1.0                      # times every deployment's rate; 1.0 is the Azure population
    diurnal: Diurnal = Diurnal()
    cv_range: tuple[float, float] = (1.0, 4.0)   # bounds of inter-arrival CVs; (1, 1) is Poisson
    code_fraction: float = 0.3                   # of deployments serving code rather than chat
    catalogue: tuple[CatalogueEntry, ...] = CATALOGUE
    size_skew: float = 0.5                       # model i picked in proportion to parameters_b ** -size_skew
    gpu_memory_bytes: int = 80 * 2 ** 30
    memory_headroom: float = 0.3                 # GPU memory beyond the weights a replica needs
    max_gpu_count: int = 8
    chat_lengths: LengthModel = CHAT
    code_lengths: LengthModel = CODE

    def __post_init__(self) -> None:
        _require(self.deployments >= 1 and self.tenants >= 1, "deployments and tenants must be >= 1")
        _require(self.seed >= 0, "seed must be >= 0")
        _require(self.duration_s > 0 and self.rate_scale > 0, "duration_s and rate_scale must be > 0")
        _require(0 <= self.diurnal.amplitude < 1, "diurnal.amplitude must be in [0, 1)")
        _require(1e-3 <= self.cv_range[0] <= self.cv_range[1], "cv_range must be (low, high), low > 0")
        _require(0 <= self.code_fraction <= 1, "code_fraction must be in [0, 1]")
        _require(len(self.catalogue) > 0, "catalogue must not be empty")

    def lengths(self, kind: Kind) -> LengthModel:
        return self.code_lengths if kind == "code" else self.chat_lengths


def _require(holds: bool, message: str) -> None:
    if not holds:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class DeploymentTraffic:
    """One deployment and the arrival process that feeds it."""
    deployment: Deployment
    cv: float                        # of inter-arrival times, before the diurnal swing
    index: int                       # seeds its requests' generator


def plan(config: TrafficConfig) -> tuple[DeploymentTraffic, ...]:
    rng = np.random.default_rng((config.seed, _PLAN))
    n = config.deployments
    shapes = [model_shape(entry, config.gpu_memory_bytes, config.memory_headroom, config.max_gpu_count)
              for entry in config.catalogue]
    models = rng.choice(len(shapes), size=n, p=size_mix(config.catalogue, config.size_skew))
    codes = rng.random(n) < config.code_fraction
    owners = rng.choice(config.tenants, size=n, p=_zipf(config.tenants))
    rates = rates_per_s(rng, n, config.rate_scale)
    cvs = burst_cvs(rng, n, config.cv_range)
    return tuple(
        DeploymentTraffic(Deployment(name=f"dep{i:05d}", tenant=f"tenant{int(owners[i]):04d}",
                                     model=shapes[int(models[i])], kind="code" if codes[i] else "chat",
                                     mean_rate_per_s=float(rates[i])),
                          cv=float(cvs[i]), index=i)
        for i in range(n))


def _zipf(n: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1)
    shares: np.ndarray = weights / weights.sum()
    return shares


def generate(config: TrafficConfig, arrivals_seed: Optional[int] = None) -> Trace:
    """The config's trace; with `arrivals_seed`, the same deployments at the same rates and
    burstiness, their arrivals and lengths drawn again from that seed (a trace apart, to fit
    on, for one the simulator is then held against)."""
    planned = plan(config)
    drawn = config if arrivals_seed is None else replace(config, seed=arrivals_seed)
    return Trace(deployments=tuple(p.deployment for p in planned), duration_s=config.duration_s,
                 requests=functools.partial(_stream, drawn, planned))


def _stream(config: TrafficConfig, planned: tuple[DeploymentTraffic, ...]) -> Iterator[Request]:
    names = [p.deployment.name for p in planned]
    return merge(names, [_chunks(config, p) for p in planned])


def _chunks(config: TrafficConfig, traffic: DeploymentTraffic) -> Iterator[Chunk]:
    rng = np.random.default_rng((config.seed, _ARRIVALS, traffic.index))
    deployment = traffic.deployment
    lengths = config.lengths(deployment.kind)
    for times in arrival_times(rng, deployment.mean_rate_per_s, traffic.cv, config.diurnal, config.duration_s):
        yield Chunk(times, *draw_lengths(rng, lengths, len(times)))
