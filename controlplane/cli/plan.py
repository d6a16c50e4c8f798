"""`thawpool plan`: how many nodes of which GPU kind a trace needs to meet a TTFT SLO,
what that costs, and how each deployment should scale (poolsim/planner.py), beside the
textbook estimate (poolsim/textbook.py). Offline: it simulates, it calls no server.

    thawpool plan --requests day.jsonl --deployments deployments.json --slo small=2,medium=5,large=20
    thawpool plan --synthetic --hours 2 --count 300        # an Azure-shaped trace instead
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from poolsim.planner import Plan, Slo, plan
from poolsim.policies import BASELINES
from poolsim.replica_model import gpu_kind
from poolsim.trace_files import TraceFileError, read_trace
from poolsim.traffic import TrafficConfig, generate
from poolsim.workload import Trace

CLASSES = {"small": "small (<4B)", "medium": "medium (4-20B)", "large": "large (>20B)"}
SHOWN_RECOMMENDATIONS = 15


def add_plan(commands: Any) -> None:
    p = commands.add_parser("plan", help="the pool a trace needs for a TTFT SLO, by simulation")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--requests", help="the trace's requests (.jsonl or .csv; docs/capacity.md)")
    source.add_argument("--synthetic", action="store_true", help="an Azure-shaped trace (poolsim/traffic.py)")
    p.add_argument("--deployments", help="with --requests: the deployments file (.json)")
    p.add_argument("--hours", type=float, default=2.0, help="--synthetic: its length")
    p.add_argument("--count", type=int, default=300, help="--synthetic: deployments")
    p.add_argument("--rate-scale", type=float, default=0.2, help="--synthetic: times the Azure rates")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slo", default="small=2,medium=5,large=20",
                   help="TTFT p99 seconds by model size: small (<4B), medium (4-20B), large (>20B)")
    p.add_argument("--max-lost", type=float, default=0.001, help="share of requests refused or timed out")
    p.add_argument("--gpus", default="h100,a100", help="GPU kinds to consider (poolsim/params/*.json)")
    p.add_argument("--policies", default="thawpool-60s,thawpool-learned",
                   help=f"scaling policies to consider: {', '.join(BASELINES)}")
    p.add_argument("--max-nodes", type=int, default=64)
    p.add_argument("--json", action="store_true", help="the whole plan as JSON")
    p.set_defaults(func=cmd_plan)


def parse_slo(text: str, max_lost: float) -> Slo:
    targets = {}
    for part in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = part.partition("=")
        if name not in CLASSES:
            raise ValueError(f"--slo: {name!r} is not a size class ({', '.join(CLASSES)})")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"--slo: {part!r} is not class=seconds") from None
        if not seconds > 0:
            raise ValueError(f"--slo: {name} must be more than 0 seconds")
        targets[CLASSES[name]] = seconds
    return Slo(targets, max_lost)


def load_trace(args: argparse.Namespace) -> Trace:
    if args.requests:
        if not args.deployments:
            raise ValueError("--requests needs --deployments")
        return read_trace(args.requests, args.deployments)
    return generate(TrafficConfig(deployments=args.count, tenants=max(1, args.count // 4),
                                  duration_s=args.hours * 3600.0, seed=args.seed, rate_scale=args.rate_scale))


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        slo = parse_slo(args.slo, args.max_lost)
        kinds = [gpu_kind(name.strip()) for name in args.gpus.split(",")]
        unknown = [n for n in args.policies.split(",") if n not in BASELINES]
        if unknown:
            raise ValueError(f"--policies: unknown {', '.join(unknown)} (known: {', '.join(BASELINES)})")
        policies = [BASELINES[n]() for n in args.policies.split(",")]
        result = plan(load_trace(args), kinds, policies, slo, max_nodes=args.max_nodes)
    except (ValueError, TraceFileError, OSError) as exc:
        print(f"thawpool plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(as_json(result), indent=2, default=str))
    else:
        show(result, slo)
    return 0 if result.best is not None else 1


def show(result: Plan, slo: Slo) -> None:
    targets = ", ".join(f"{k} {v:g}s" for k, v in slo.ttft_p99_s.items())
    print(f"SLO: TTFT p99 {targets}; at most {slo.max_lost:.2%} lost")
    print(f"{'gpu':6s} {'policy':17s} {'nodes':>5s} {'meets':>5s} {'p99 s':>7s} {'GPU-h held':>10s} "
          f"{'fleet $':>9s}  TTFT p99 by size")
    for t in result.tried:
        o = t.outcome
        sizes = "  ".join(f"{k.split()[0]} {p99:.2f}" for k, (_, p99) in o.ttft_by_class.items())
        print(f"{t.kind:6s} {t.policy:17s} {t.nodes:5d} {'yes' if t.meets else 'no':>5s} {o.ttft_p99_s:7.2f} "
              f"{o.gpu_hours:10.1f} {o.fleet_cost:9.0f}  {sizes}")
    for kind, why in result.unfit.items():
        print(f"{kind}: not considered: {why}")
    for kind, est in result.textbook.items():
        print(f"textbook ({kind}): {est.peak_gpus:.1f} GPUs busy at the peak minute (batch {est.batch}, "
              f"mean lengths) + {est.headroom:.0%} = {est.gpus:.1f} GPUs -> {est.nodes} node(s); "
              f"mean {est.mean_gpus:.1f} GPUs busy")
    best = result.best
    if best is None:
        print("no pool of the kinds and sizes tried meets the SLO; raise --max-nodes or relax --slo")
        return
    est = result.textbook[best.kind]
    o = best.outcome
    print(f"plan: {best.nodes} node(s) of {best.kind} with {best.policy}: fleet ${o.fleet_cost:,.0f} for "
          f"{o.duration_s / 3600:g} h; replicas held {o.gpu_hours:.1f} GPU-hours (${o.cost:,.0f}); "
          f"TTFT p50 {o.ttft_p50_s:.3f} s, p99 {o.ttft_p99_s:.2f} s")
    print(f"textbook vs simulation ({best.kind}): {est.nodes} vs {best.nodes} node(s) "
          f"({best.nodes / est.nodes:.2f}x the estimate)")
    recs = sorted(result.recommendations, key=lambda r: -o.deployments[r.deployment].requests)
    print(f"recommended scaling (the {min(SHOWN_RECOMMENDATIONS, len(recs))} busiest of {len(recs)}; "
          "--json for all): deployment min max idle_s sleep_s window")
    for r in recs[:SHOWN_RECOMMENDATIONS]:
        window = f"{r.prewarm_s:.0f}-{r.keep_until_s:.0f}s" if r.prewarm_s is not None else "-"
        print(f"  {r.deployment} {r.min_replicas} {r.max_replicas} {r.idle_timeout_s:g} {r.sleep_timeout_s:g} {window}")


def as_json(result: Plan) -> dict[str, Any]:
    def tried(t: Any) -> dict[str, Any]:
        return {"kind": t.kind, "policy": t.policy, "nodes": t.nodes, "meets": t.meets,
                "outcome": t.outcome.to_json()}
    return {"best": tried(result.best) if result.best else None,
            "tried": [tried(t) for t in result.tried],
            "textbook": {k: asdict(v) | {"gpus": v.gpus} for k, v in result.textbook.items()},
            "recommendations": [asdict(r) for r in result.recommendations], "unfit": dict(result.unfit)}
