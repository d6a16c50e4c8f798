"""The capacity estimate planning starts from, before any simulation.

A replica that runs B requests at once, each taking T seconds (prefill, then its
output tokens at the step time of a batch of B), serves about B / T requests a
second; the pool needs the peak rate over that, plus 30% headroom. Here every
request counts for the GPU-seconds it would take at that batch (T * gpus / B: a
deployment's replicas may span several GPUs, and models differ), summed over each
minute of the trace: the busiest minute over 60 s is the GPUs busy at the peak.
T is taken at each deployment's mean prompt and output lengths, as the estimate is
usually made: one request time per model. The planner prints it beside the
simulation on the same trace, which shows how optimistic it is (variable lengths,
cold starts, the tail of a TTFT SLO, replicas that cannot be packed tight).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from poolsim.replica_model import GpuKind
from poolsim.workload import Trace


@dataclass(frozen=True)
class TextbookEstimate:
    batch: int
    headroom: float
    peak_gpus: float              # GPUs busy in the busiest minute, before headroom
    mean_gpus: float              # ... averaged over the trace
    nodes: int                    # peak plus headroom, in whole nodes

    @property
    def gpus(self) -> float:
        return self.peak_gpus * (1.0 + self.headroom)


def estimate(trace: Trace, kind: GpuKind, batch: int = 32, headroom: float = 0.3,
             window_s: float = 60.0) -> TextbookEstimate:
    means = _mean_lengths(trace)
    per_request = {}
    tp = kind.throughput
    for dep in trace.deployments:
        prompt, output = means.get(dep.name, (0.0, 0.0))
        model = dep.model
        seconds = tp.prefill_s(model.parameters_b * 1e9, model.gpu_count, int(prompt)) \
            + output * tp.step_s(model.weight_bytes, model.gpu_count, batch)
        per_request[dep.name] = seconds * model.gpu_count / batch
    busy: dict[int, float] = defaultdict(float)
    for req in trace.requests():
        busy[int(req.at_s // window_s)] += per_request[req.deployment]
    peak = max(busy.values(), default=0.0) / window_s
    mean = sum(busy.values()) / trace.duration_s
    nodes = max(1, math.ceil(peak * (1.0 + headroom) / kind.gpus_per_node))
    return TextbookEstimate(batch, headroom, peak, mean, nodes)


def _mean_lengths(trace: Trace) -> dict[str, tuple[float, float]]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for req in trace.requests():
        acc = sums[req.deployment]
        acc[0] += 1
        acc[1] += req.prompt_tokens
        acc[2] += req.output_tokens
    return {name: (p / n, o / n) for name, (n, p, o) in sums.items()}
