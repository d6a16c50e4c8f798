"""A machine kind fitted to what a calibration run timed on it: the replica model's
formulas (poolsim/replica_model.py) with this machine's parameters, so that the
simulator can be held against the real pool on the same machine.

Pure: the timing is the caller's (benchmarks/pool_sim_validation.py times requests
through `thawpool up`). Every figure is the median of its repeats, then:

  decode    step(b) = base + b * per_seq, least squares over batch sizes; base stands
            for weight_bytes / hbm_gbps, an effective rate (on a CPU with a tiny model
            the step is mostly the engine's own work, not memory)
  prefill   a warm TTFT at batch 1 is gateway + overhead + p * c + step(1), least
            squares over prompt lengths p: c gives prefill_tflops (c = 2 * parameters /
            FLOPS); the intercept less step(1) and the gateway is request_overhead_s
  gateway   a burst of k requests sent at once passes the gateway one at a time: the
            first token of its last request comes k * (gateway + p * c) after a fixed
            part (each prompt prefilled in turn behind it), least squares over k
  cold      a tier's cold start is a cold request's TTFT less a warm one's at the same
            prompt length: what the simulator adds before prefill. s3 is a first start
            (the download, then a standby's load) less a standby's load
  bytes     one model size cannot tell a fixed part from a per-byte part, so each
            transfer's GB/s is a bulk rate timed apart (an S3 GET, a read from the page
            cache) and fixed_s is the rest of the median
  refill    a taken standby is replaced `refill_delay_s` after its load by a new
            process, ready a fresh process's start later
  contention (CPU slots) the delay each other request in flight on the node adds to a
            first token (Throughput.stream_s) is what no probe of one request or one
            burst shows: it is fitted to a replay of its own, a trace apart from the one
            the simulator is then held against (`fit_stream_s`)
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from poolsim.replica_model import GB, ColdStarts, GpuKind, Throughput, Transfer

TIERS = ("s3", "standby", "cache")


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


@dataclass(frozen=True)
class Machine:
    """What the kind is named and how the pool there is laid out (CPU slots on one node)."""
    name: str
    slots: int
    slot_memory_gb: float
    cores: int                       # Throughput.node_cores: what the slots' replicas share
    prefill_step_tokens: int         # the engine's max_num_batched_tokens
    max_batch: int = 256             # its max_num_seqs


@dataclass(frozen=True)
class Timings:
    """What a calibration run measured, each as every repeat."""
    weight_bytes: int
    parameters: float
    step_s: Mapping[int, Sequence[float]]          # batch -> seconds a decode step
    warm_ttft_s: Mapping[int, Sequence[float]]     # prompt tokens -> a warm TTFT at batch 1
    burst_last_ttft_s: Mapping[int, Sequence[float]]   # k -> a burst of k's last first token
    burst_prompt_tokens: int                       # the prompt of every request of a burst
    cold_ttft_s: Mapping[str, Sequence[float]]     # tier (TIERS) -> a cold request's TTFT
    cold_prompt_tokens: int                        # the prompt of every cold request
    s3_gbps: float                                 # bulk rates (the module's "bytes")
    read_gbps: float
    refill_delay_s: float                          # PoolSettings.standby_refill_delay_s


def fit_line(points: Sequence[tuple[float, float]]) -> Line:
    """Least squares y = a + b x; at least two distinct x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a line needs at least two distinct x")
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return Line(my - slope * mx, slope)


def medians(samples: Mapping[int, Sequence[float]]) -> list[tuple[float, float]]:
    return [(float(x), statistics.median(ys)) for x, ys in sorted(samples.items())]


def cold_starts_s(t: Timings, warm: Line) -> dict[str, float]:
    """Each tier's cold start: its median cold TTFT less a warm TTFT at the same prompt."""
    warm_ttft = warm.at(t.cold_prompt_tokens)
    cold = {tier: statistics.median(t.cold_ttft_s[tier]) - warm_ttft for tier in TIERS}
    cold["s3"] -= cold["standby"]            # the first start loaded into a standby after it
    return {tier: max(0.0, s) for tier, s in cold.items()}


def transfer(seconds: float, nbytes: int, gbps: float) -> Transfer:
    return Transfer(max(0.0, seconds - nbytes / (gbps * GB)), gbps)


def throughput(t: Timings, machine: Machine) -> tuple[Throughput, Line]:
    """The decode and prefill fits, and the warm TTFT line the cold starts are read against."""
    step = fit_line(medians(t.step_s))
    warm = fit_line(medians(t.warm_ttft_s))
    base, per_seq = max(step.intercept, 1e-6), max(step.slope, 0.0)
    per_token = max(warm.slope, 1e-9)        # noise must not make prefill free or negative
    burst = fit_line(medians(t.burst_last_ttft_s))
    gateway = max(0.0, burst.slope - t.burst_prompt_tokens * per_token)
    tp = Throughput(hbm_gbps=t.weight_bytes / base / GB, per_seq_s=per_seq,
                    prefill_tflops=2.0 * t.parameters / per_token / 1e12, max_batch=machine.max_batch,
                    node_cores=machine.cores, request_overhead_s=max(0.0, warm.intercept - gateway - step.at(1)),
                    gateway_s=gateway, prefill_step_tokens=machine.prefill_step_tokens)
    return tp, warm


def kind(t: Timings, machine: Machine) -> GpuKind:
    tp, warm = throughput(t, machine)
    cold = cold_starts_s(t, warm)
    standby = transfer(cold["standby"], t.weight_bytes, t.read_gbps)
    starts = ColdStarts(s3=transfer(cold["s3"], t.weight_bytes, t.s3_gbps),
                        cache=transfer(cold["cache"], t.weight_bytes, t.read_gbps), standby=standby,
                        wake=standby, sleep=standby,
                        standby_refill_s=cold["standby"] + t.refill_delay_s + cold["cache"])
    source = (f"measured on this machine by poolsim.calibrate over a {t.weight_bytes / 1e6:.1f} MB model: "
              f"{machine.slots} CPU slots sharing {machine.cores} cores; wake and sleep not measured "
              "(the run used no sleep tier): a standby's load stands in")
    return GpuKind(machine.name, machine.slot_memory_gb, 0.0, machine.slots, starts, tp, source)


STREAM_S_GRID = tuple(i * 0.0005 for i in range(17))        # 0 to 8 ms


def fit_stream_s(simulated_p50: Callable[[float], float], real_p50: float,
                 grid: Sequence[float] = STREAM_S_GRID) -> float:
    """The stream_s of `grid` whose simulated TTFT p50 of a calibration replay is nearest
    (as a ratio) the p50 the real replay of the same trace had; the smallest of a tie."""
    if real_p50 <= 0:
        raise ValueError("the calibration replay answered nothing")
    return min(grid, key=lambda s: (abs(math.log(simulated_p50(s) / real_p50)), s))
