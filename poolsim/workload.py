"""What a simulation is fed: deployments and the requests that reach them.

A trace is the deployments (what each serves, for which tenant) and a stream
of requests in arrival order. The stream is an iterator, not a list: a day of
a large pool is millions of requests, and the simulator holds only those in
flight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal

Kind = Literal["chat", "code"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The model a deployment serves, as the pool sizes it."""
    name: str                        # e.g. "llama-7b"
    parameters_b: float              # billions of parameters
    weight_bytes: int                # at the dtype it is served in
    gpu_count: int = 1               # tensor-parallel ranks of one replica


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    tenant: str
    model: ModelShape
    kind: Kind = "chat"
    mean_rate_per_s: float = 0.0     # the generator's mean arrival rate (0: unknown, e.g. a replayed file)


@dataclass(frozen=True, slots=True)
class Request:
    at_s: float                      # seconds from the trace's start
    deployment: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Trace:
    deployments: tuple[Deployment, ...]
    duration_s: float
    requests: Callable[[], Iterator[Request]]   # a fresh stream, in arrival order, each call

    def deployment(self, name: str) -> Deployment:
        for dep in self.deployments:
            if dep.name == name:
                return dep
        raise KeyError(name)
