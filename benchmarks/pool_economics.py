"""Pool economics: one day of Azure-shaped traffic on a 16-node x 8-GPU pool, served by
thawpool's policies and by the baselines, in the same simulator on the same trace.

The trace (poolsim/traffic.py): --deployments deployments with Azure Functions'
heavy-tailed rates, burstiness and diurnal swing, Azure LLM trace lengths, models from
0.5B to 70B (tensor-parallel where one GPU cannot hold them), --rate-scale times the
Azure population's rates so the day fits the pool. The replicas: poolsim/params/<gpu>.json.
The policies (poolsim/policies.py):
  knative           KServe/Knative scale to zero: gone 90 s after the last call, no node
                    cache, a pod a GPU
  always-warm       one replica per deployment on GPUs of its own (as vLLM takes 90% of
                    one)
                    Both baselines get a pool with room for one replica of every
                    deployment plus --nodes more for scaling up: a pod a GPU needs about
                    twice the 16 nodes at knative's peak, and a baseline starved of GPUs
                    would lose requests rather than use GPU time
  thawpool          as deployed by default: 300 s idle, then asleep 30 min; node cache,
                    a standby a node, replicas sharing GPUs by memory
  thawpool-60s, thawpool-15s  the same with shorter idle timeouts (-15s also packs by
                    expected load)
  thawpool-learned  thawpool-60s with keep-alive windows learned per deployment and
                    prefetch on predicted arrival
  thawpool-packed   thawpool-learned with placement by expected load
Printed per policy: GPU-hours of GPUs occupied (the pool's footprint: GPUs with any
replica on them) and held by replicas (what replica lifetimes bill), the share of held
time idle, the share of requests that waited for a cold start or a wake, TTFT p50/p99,
SLO attainment (answered within 2 s for models under 8B, within the model's cold-start
floor, its weights from host memory, plus 1 s for larger ones; lost requests miss it),
requests lost, the simulator's wall time; then each policy's figures as ratios to
always-warm's and to knative's (a figure whose baseline is exactly 0 as a difference in
percentage points), the issue's targets, and the GPU-hours vs p99 TTFT frontier as
benchmarks/results/pool_economics.png.

    .venv/bin/python -m benchmarks.pool_economics [--hours 24] [--deployments 1000] [--nodes 16]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

# run as a file, benchmarks/ is first on the path and its kernels.py would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from poolsim.cluster import ClusterShape  # noqa: E402
from poolsim.outcome import Outcome  # noqa: E402
from poolsim.policies import BASELINES, StaticPolicy, thawpool, with_idle  # noqa: E402
from poolsim.replica_model import gpu_kind  # noqa: E402
from poolsim.simulator import simulate  # noqa: E402
from poolsim.traffic import TrafficConfig, generate  # noqa: E402
from poolsim.workload import Trace  # noqa: E402

PNG = Path(__file__).resolve().parent / "results" / "pool_economics.png"
SLO_ATTAINMENT = 0.99
TARGET_VS_WARM, TARGET_VS_KNATIVE = 0.25, 0.60


def thawpool_15s() -> StaticPolicy:
    return replace(with_idle(thawpool(), 15.0), name="thawpool-15s", pack_by_load=True)


POLICIES: dict[str, Callable[[], StaticPolicy]] = {**BASELINES, "thawpool-15s": thawpool_15s}


def always_warm_nodes(trace: Trace, gpus_per_node: int) -> int:
    """Room for one replica of every deployment, whole GPUs each (a baseline's pool adds
    the pool's nodes for scaling up)."""
    return math.ceil(sum(d.model.gpu_count for d in trace.deployments) / gpus_per_node) + 1


def row(o: Outcome) -> str:
    return (f"{o.policy:17s} {o.occupied_gpu_hours:9.1f} {o.gpu_hours:9.1f} {o.idle_share:6.1%} {o.cold_share:7.2%} "
            f"{o.ttft_p50_s:7.3f} {o.ttft_p99_s:7.2f} {o.slo_attainment:8.2%} {o.rejected + o.timed_out:6d} "
            f"{o.peak_gpus:5d} {o.wall_s:6.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--rate-scale", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="knative,always-warm,thawpool,thawpool-60s,thawpool-15s,"
                                              "thawpool-packed")
    parser.add_argument("--png", type=Path, default=PNG)
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
    print(f"{'policy':17s} {'occupied':>9s} {'held':>9s} {'idle':>6s} {'cold':>7s} {'p50 s':>7s} {'p99 s':>7s} "
          f"{'SLO':>8s} {'lost':>6s} {'peak':>5s} {'wall':>7s}   (GPU-hours; idle: of held; cold: of answered)")
    outcomes: dict[str, Outcome] = {}
    for name in args.policies.split(","):
        baseline = not name.startswith("thawpool")
        nodes = always_warm_nodes(trace, kind.gpus_per_node) + args.nodes if baseline else args.nodes
        outcomes[name] = simulate(trace, ClusterShape(nodes, kind), POLICIES[name]())
        print(row(outcomes[name]), flush=True)
    ratios(outcomes)
    frontier(outcomes, args.png)


RATIO_COLUMNS = (("occupied", lambda o: o.occupied_gpu_seconds), ("held", lambda o: o.gpu_seconds),
                 ("idle", lambda o: o.idle_share), ("cold", lambda o: o.cold_share),
                 ("p50", lambda o: o.ttft_p50_s), ("p99", lambda o: o.ttft_p99_s),
                 ("SLO", lambda o: o.slo_attainment))


def ratio(value: float, peer: float) -> str:
    """value / peer; where the peer's is exactly 0 (a cold share with no cold start) the
    difference in percentage points, as a ratio to nothing means nothing."""
    if peer:
        return f"{value / peer:.3f}x"
    return f"{(value - peer) * 100:+.2f}pt"


def ratio_rows(outcomes: dict[str, Outcome], peer: Outcome) -> list[str]:
    """Every other policy's figures as ratios to `peer`'s, one row each."""
    head = f"vs {peer.policy:16s}" + "".join(f" {name:>9s}" for name, _ in RATIO_COLUMNS)
    rows = [head]
    for name, o in outcomes.items():
        if name != peer.policy:
            rows.append(f"   {name:16s}" + "".join(f" {ratio(get(o), get(peer)):>9s}" for _, get in RATIO_COLUMNS))
    return rows


def ratios(outcomes: dict[str, Outcome]) -> None:
    warm, knative = outcomes.get("always-warm"), outcomes.get("knative")
    for peer in (warm, knative):
        if peer is not None:
            print("\n".join(ratio_rows(outcomes, peer)))
    if warm is None or knative is None:
        return
    meeting = [o for n, o in outcomes.items() if n.startswith("thawpool") and o.slo_attainment >= SLO_ATTAINMENT]
    if not meeting:
        print(f"target: no thawpool policy reached {SLO_ATTAINMENT:.0%} SLO attainment")
        return
    best = min(meeting, key=lambda o: o.occupied_gpu_seconds)
    vs_warm = best.occupied_gpu_seconds / warm.occupied_gpu_seconds
    vs_knative = best.occupied_gpu_seconds / knative.occupied_gpu_seconds
    print(f"target (SLO attainment >= {SLO_ATTAINMENT:.0%}): {best.policy} at {best.slo_attainment:.2%} uses "
          f"{vs_warm:.1%} of always-warm's GPU-seconds (target <= {TARGET_VS_WARM:.0%}: "
          f"{'met' if vs_warm <= TARGET_VS_WARM else 'NOT met'}) and {vs_knative:.1%} of knative's "
          f"(target <= {TARGET_VS_KNATIVE:.0%}: {'met' if vs_knative <= TARGET_VS_KNATIVE else 'NOT met'}); "
          f"knative's SLO attainment {knative.slo_attainment:.2%}, always-warm's {warm.slo_attainment:.2%}")


def frontier(outcomes: dict[str, Outcome], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for o in outcomes.values():
        ours = o.policy.startswith("thawpool")
        ax.scatter(o.occupied_gpu_hours, o.ttft_p99_s, marker="o" if ours else "s",
                   color="tab:blue" if ours else "tab:red")
        ax.annotate(f"{o.policy} ({o.slo_attainment:.1%})", (o.occupied_gpu_hours, o.ttft_p99_s),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPU-hours occupied (log)")
    ax.set_ylabel("TTFT p99, s (log)")
    ax.set_title("GPU time vs tail latency, one simulated day (SLO attainment in brackets)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"frontier: {png}")


if __name__ == "__main__":
    from benchmarks.results import recorded
    with recorded(__file__):
        main()
