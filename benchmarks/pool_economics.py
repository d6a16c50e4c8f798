"""Pool economics: one day of Azure-shaped traffic on a 16-node x 8-GPU pool, served by
thawpool's policies and by the baselines, in the same simulator on the same trace.

The trace (poolsim/traffic.py): --deployments deployments with Azure Functions'
heavy-tailed rates, burstiness and diurnal swing, Azure LLM trace lengths, models from
0.5B to 70B (tensor-parallel where one GPU cannot hold them), --rate-scale times the
Azure population's rates so the day fits the pool. The replicas: poolsim/params/<gpu>.json.
The policies (poolsim/policies.py): Knative/KServe scale to zero (90 s, no node cache),
thawpool as deployed by default (300 s idle, sleep tier, node cache, standby),
thawpool with a 60 s idle timeout, the same with learned keep-alive windows, that with
placement by expected load, and one always-warm replica per deployment, which gets as many nodes as that takes (its GPU
count is its cost). Printed per policy: TTFT p50/p99 overall and per model size, cold
starts by tier, GPU-hours held and their cost, requests refused or timed out, and the
simulator's own wall time; then the ratios a reader compares.

    .venv/bin/python -m benchmarks.pool_economics [--hours 24] [--deployments 1000] [--nodes 16]
"""
from __future__ import annotations

import argparse
import math
import time

from poolsim.cluster import ClusterShape
from poolsim.outcome import Outcome
from poolsim.policies import BASELINES
from poolsim.replica_model import gpu_kind
from poolsim.simulator import simulate
from poolsim.traffic import TrafficConfig, generate
from poolsim.workload import Trace


def always_warm_nodes(trace: Trace, gpus_per_node: int) -> int:
    """Room for one replica of every deployment, whole GPUs each (an upper bound: the
    simulation reports how many it used)."""
    return math.ceil(sum(d.model.gpu_count for d in trace.deployments) / gpus_per_node) + 1


def row(o: Outcome) -> str:
    classes = "  ".join(f"{k.split()[0]} {p50:.2f}/{p99:.2f}" for k, (p50, p99) in o.ttft_by_class.items())
    cold = " ".join(f"{k} {v}" for k, v in o.cold_starts.items())
    return (f"{o.policy:17s} {o.ttft_p50_s:7.3f} {o.ttft_p99_s:8.2f}  {o.gpu_hours:9.1f} {o.cost:9.0f} "
            f"{o.peak_gpus:5d} {o.rejected + o.timed_out:7d}  {o.wall_s:6.0f}s  | {classes} | cold: {cold}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--rate-scale", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies",
                        default="knative,thawpool,thawpool-60s,thawpool-learned,thawpool-packed,always-warm")
    args = parser.parse_args()
    kind = gpu_kind(args.gpu)
    trace = generate(TrafficConfig(deployments=args.deployments, tenants=max(1, args.deployments // 4),
                                   duration_s=args.hours * 3600.0, seed=args.seed, rate_scale=args.rate_scale,
                                   gpu_memory_bytes=kind.memory_bytes))
    started = time.perf_counter()
    requests = sum(1 for _ in trace.requests())
    print(f"trace: {args.deployments} deployments, {args.hours:g} h, {requests} requests "
          f"(generated in {time.perf_counter() - started:.1f} s); pool: {args.nodes} nodes x "
          f"{kind.gpus_per_node} {kind.name} (${kind.price_per_hour}/GPU-hour); seed {args.seed}")
    print(f"{'policy':17s} {'p50 s':>7s} {'p99 s':>8s}  {'GPU-hours':>9s} {'cost $':>9s} {'peak':>5s} "
          f"{'lost':>7s}  {'wall':>7s} | TTFT p50/p99 s by size | cold starts by tier")
    outcomes: dict[str, Outcome] = {}
    for name in args.policies.split(","):
        nodes = always_warm_nodes(trace, kind.gpus_per_node) if name == "always-warm" else args.nodes
        outcomes[name] = simulate(trace, ClusterShape(nodes, kind), BASELINES[name]())
        print(row(outcomes[name]), flush=True)
    ratios(outcomes)


def ratios(outcomes: dict[str, Outcome]) -> None:
    best = outcomes.get("thawpool-60s") or outcomes.get("thawpool")
    if best is None:
        return
    for name, o in outcomes.items():
        if o is best:
            continue
        print(f"{best.policy} vs {name}: GPU-hours {best.gpu_hours / o.gpu_hours:.2f}x, "
              f"TTFT p99 {best.ttft_p99_s / o.ttft_p99_s:.2f}x, p50 {best.ttft_p50_s / o.ttft_p50_s:.2f}x, "
              f"cold starts (not wakes) {sum(v for k, v in best.cold_starts.items() if k != 'wake')} vs "
              f"{sum(v for k, v in o.cold_starts.items() if k != 'wake')}")


if __name__ == "__main__":
    from benchmarks.results import recorded
    with recorded(__file__):
        main()
