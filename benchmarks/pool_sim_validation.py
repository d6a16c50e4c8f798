"""The pool simulator against the real stack: one scaled-down trace through `thawpool up`
and through poolsim, with the replica model calibrated on the same machine (issue 34).

    .venv/bin/python benchmarks/pool_sim_validation.py [--duration 600] [--seed 3] [--rate-scale 12]

1. Starts the fault suite's platform (tests/faults/stack.py: its own Postgres, SeaweedFS
   S3 and `thawpool up` as separate processes) with `--slots` CPU slots, and writes small
   random Llamas (MODEL), each deployment's its own copy in S3.
2. Calibrates: benchmarks/calibration_probes.py times cold starts by tier, decode steps
   by batch and warm TTFT by prompt length through the stack; poolsim.calibrate fits
   them into a kind. What no probe of one request or one burst shows, the delay the
   other requests in flight add to a first token on these few cores (`stream_s`), is
   fitted to a calibration replay: the same deployments at the same rates, their
   arrivals drawn from another seed (`--calibration-duration` s), replayed for real, then
   simulated for each point of poolsim.calibrate's grid; the nearest TTFT p50 wins. The
   kind is written to benchmarks/results/pool_sim_validation/cpu-local.json (this
   machine's, for this run: not a kind for poolsim/params).
3. Generates the trace (poolsim.traffic: `--deployments` over `--tenants`, `--duration`
   seconds, Azure-shaped rates times `--rate-scale`, CPU-sized lengths), every deployment
   serving the model, and writes it next to the results.
4. Replays it for real (benchmarks/pool_run.py), every deployment created as `scaling`
   says (no sleep tier, one warm standby, the node's weight cache, scale to zero after
   `--idle-timeout` s) with cold caches; then reads what the platform reports: replica
   starts from its replica lifetimes, GPU-seconds from GET /v1/billing/report, both over
   the trace's window.
5. Simulates the same trace files on one node of the calibrated kind with `policy`, the
   same tick, queue limit and acquire timeout, caches cold.
6. Prints each pair, real against simulated, and whether it agrees within 15%: TTFT p50
   and p99 (the client's, answered requests), cold starts, GPU-seconds; then each
   deployment's, the slowest first tokens of each, and the real TTFT p50 by how many other
   requests were in flight while a request waited for its first token (`by_overlap`), to
   tell which formula is off. Every real request and replica is kept in
   real_requests.jsonl and real_replicas.jsonl; `--overlaps` prints that last table again
   from a kept real_requests.jsonl, without running anything.

The report is also written to benchmarks/results/pool_sim_validation.txt. The machine's
other work moves every timing: the report says how busy it was during the replay.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Iterable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import calibration_probes  # noqa: E402
from benchmarks.pool_run import RealRun, Scaling, deployer, open_replicas, run, write_run  # noqa: E402
from benchmarks.results import RESULTS  # noqa: E402
from benchmarks.standby import standby_ready  # noqa: E402
from pool.autoscaler import ScalingConfig  # noqa: E402
from pool.settings import PoolSettings  # noqa: E402
from poolsim.arrivals import Diurnal  # noqa: E402
from poolsim.calibrate import Machine, Timings, fit_stream_s, kind  # noqa: E402
from poolsim.cluster import ClusterShape  # noqa: E402
from poolsim.lengths import LengthModel  # noqa: E402
from poolsim.outcome import percentiles  # noqa: E402
from poolsim.policies import StaticPolicy  # noqa: E402
from poolsim.replica_model import GpuKind, to_json  # noqa: E402
from poolsim.simulator import SimSettings, Simulation  # noqa: E402
from poolsim.trace_files import read_trace, write_trace  # noqa: E402
from poolsim.traffic import TrafficConfig, generate  # noqa: E402
from poolsim.workload import Deployment, ModelShape, Trace  # noqa: E402
from spec.engine_options import EngineOptions  # noqa: E402
from tests.faults.stack import ACQUIRE_TIMEOUT_S, FaultStack  # noqa: E402
from tests.support.model_factory import ModelSpec, make_model  # noqa: E402

OUT = RESULTS / "pool_sim_validation"
TOLERANCE = 0.15
MODEL = ModelSpec(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=2048, max_position_embeddings=2048)
SLOT_MEMORY_GB = 2.0                 # what tests/faults/stack.py gives each slot
QUEUE_LIMIT, SCALE_DOWN_DELAY_S, TICK_S = 64, 30.0, 0.5
# CPU-sized requests: chat prompts of about 64 tokens answered in about 32, code prompts of
# about 192 answered in about 12 (the Azure kinds' shapes, shorter)
CHAT = LengthModel(64, 0.8, 32, 0.8, max_prompt_tokens=512, max_output_tokens=256)
CODE = LengthModel(192, 0.8, 12, 0.6, max_prompt_tokens=512, max_output_tokens=64)
# `thawpool up`'s settings (over the fault suite's, which are tuned to show faults fast):
# the pool's default tick and scale-down delay, patient database timeouts
STACK_ENV = {"THAWPOOL_TICK_S": str(TICK_S), "THAWPOOL_SCALE_DOWN_DELAY_S": str(SCALE_DOWN_DELAY_S),
             "THAWPOOL_QUEUE_LIMIT": str(QUEUE_LIMIT), "THAWPOOL_DB_STATEMENT_TIMEOUT_S": "10",
             "THAWPOOL_DB_POOL_TIMEOUT_S": "5", "THAWPOOL_DB_CONNECT_TIMEOUT_S": "5"}


def scaling(idle_timeout_s: float) -> Scaling:
    """Up to 4 replicas share a slot's memory (the simulator packs them the same way)."""
    return Scaling(idle_timeout_s=idle_timeout_s, max_replicas=2, target_concurrency=8, replica_memory_gb=0.5,
                   kv_cache_tokens=4096)


def policy(s: Scaling) -> StaticPolicy:
    """The simulator's side of `s`: no sleep tier, the node's cache, its standbys."""
    config = ScalingConfig(max_replicas=s.max_replicas, target_concurrency=s.target_concurrency,
                           idle_timeout_s=s.idle_timeout_s, scale_down_delay_s=SCALE_DOWN_DELAY_S)
    return StaticPolicy("validation", config, node_cache=True, standbys_per_node=PoolSettings().warm_pool_size)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="the trace's seconds (default 600)")
    p.add_argument("--deployments", type=int, default=6)
    p.add_argument("--tenants", type=int, default=2)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--rate-scale", type=float, default=12.0, help="times the Azure population's rates")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds idle before scale to zero")
    p.add_argument("--slots", type=int, default=4, help="CPU slots of the pool")
    p.add_argument("--calibration-duration", type=float, default=240.0,
                   help="seconds of the calibration replay that fits stream_s (default 240)")
    p.add_argument("--overlaps", type=Path, default=None, metavar="REAL_REQUESTS_JSONL",
                   help="only print a kept run's TTFT p50 by overlap (real_requests.jsonl)")
    return p.parse_args()


CALIBRATION_SEED_OFFSET = 1000       # the calibration replay's arrivals: never the validated trace's
CALIBRATION_PREFIX = "cal-"          # its deployments and tenants, apart from the validated ones


def scaled_trace(args: argparse.Namespace, model: ModelShape, calibration: bool = False) -> Trace:
    """The validated trace; with `calibration`, the one stream_s is fitted to: the same
    deployments (renamed) at the same rates, arrivals from another seed."""
    duration = args.calibration_duration if calibration else args.duration
    config = TrafficConfig(deployments=args.deployments, tenants=args.tenants, duration_s=duration,
                           seed=args.seed, rate_scale=args.rate_scale, diurnal=Diurnal(amplitude=0.0),
                           chat_lengths=CHAT, code_lengths=CODE)
    trace = generate(config, args.seed + CALIBRATION_SEED_OFFSET if calibration else None)
    prefix = CALIBRATION_PREFIX if calibration else ""
    deps = tuple(Deployment(prefix + d.name, prefix + d.tenant, model, d.kind, d.mean_rate_per_s)
                 for d in trace.deployments)
    stream = trace.requests
    if not prefix:
        return Trace(deps, trace.duration_s, stream)
    return Trace(deps, trace.duration_s, lambda: (replace(r, deployment=prefix + r.deployment) for r in stream()))


def fitted(gpu: GpuKind, trace: Trace, real: RealRun, s: Scaling) -> GpuKind:
    """The kind with the stream_s whose simulation of the calibration replay comes nearest
    its real TTFT p50; prints every point tried."""
    real_p50, _ = percentiles(answered_ttfts(real))
    tried: dict[float, float] = {}

    def simulated_p50(stream_s: float) -> float:
        candidate = replace(gpu, throughput=replace(gpu.throughput, stream_s=stream_s))
        tried[stream_s] = percentiles(run_sim(trace, candidate, s).tally.ttft)[0]
        return tried[stream_s]

    best = fit_stream_s(simulated_p50, real_p50)
    print(f"calibration replay: {len(real.sent)} requests, TTFT p50 {real_p50 * 1000:.1f} ms; simulated p50 (ms) "
          f"by stream_s (ms): " + ", ".join(f"{k * 1000:g}: {v * 1000:.1f}" for k, v in tried.items())
          + f"; fitted stream_s {best * 1000:g} ms")
    return replace(gpu, throughput=replace(gpu.throughput, stream_s=best))


def model_shape(folder: Path) -> ModelShape:
    nbytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return ModelShape("random-llama-cpu", parameters_b=nbytes / 4 / 1e9, weight_bytes=nbytes)   # fp32


def run_sim(trace: Trace, gpu: GpuKind, s: Scaling) -> Simulation:
    settings = SimSettings(tick_s=TICK_S, queue_limit=QUEUE_LIMIT, wait_timeout_s=ACQUIRE_TIMEOUT_S,
                           kv_cache_tokens=s.kv_cache_tokens, warm_caches=False)
    shape = ClusterShape(1, gpu, node_cache_gb=PoolSettings().cache_disk_budget_gb,
                         sleep_host_memory_gb=PoolSettings().sleep_host_memory_gb)
    sim = Simulation(trace, shape, policy(s), settings)
    sim.run()
    return sim


# ------------------------------------------------------------------ the report


def pair(name: str, real: float, simulated: float, unit: str) -> bool:
    ratio = simulated / real if real else float("inf")
    agrees = abs(ratio - 1.0) <= TOLERANCE
    print(f"  {name:12s} real {real:9.1f} {unit:2s}  sim {simulated:9.1f} {unit:2s}  sim/real {ratio:5.2f}  "
          f"{'within 15%' if agrees else 'NOT within 15%'}")
    return agrees


def report(trace: Trace, real: RealRun, sim: Simulation) -> int:
    answered = answered_ttfts(real)
    out = sim.tally
    real_p50, real_p99 = percentiles(answered)
    sim_p50, sim_p99 = percentiles(out.ttft)
    show_runs(real, sim, len(answered))
    print("\npairs (real: the client's TTFT, the platform's own books; sim: poolsim on the calibrated kind)")
    agree = [pair("TTFT p50", real_p50 * 1000, sim_p50 * 1000, "ms"),
             pair("TTFT p99", real_p99 * 1000, sim_p99 * 1000, "ms"),
             pair("cold starts", sum(real.starts.values()), sum(out.cold_starts.values()), ""),
             pair("GPU-seconds", sum(real.gpu_seconds.values()), out.gpu_seconds, "s")]
    print(f"agree within 15%: {sum(agree)} of {len(agree)}")
    print("\nper deployment: requests, cold starts real / sim, GPU-seconds real / sim")
    for dep in trace.deployments:
        stats = out.deployments[dep.name]
        print(f"  {dep.name} {dep.tenant} {stats.requests:5d}   {real.starts.get(dep.name, 0):3d} / "
              f"{stats.cold_starts:3d}   {real.gpu_seconds.get(dep.name, 0.0):7.1f} / {stats.gpu_seconds:7.1f}")
    slowest = 12
    for name, ttfts in (("real", answered), ("sim", out.ttft)):
        print(f"the {slowest} slowest first tokens, {name} (ms): "
              f"{[round(t * 1000) for t in sorted(ttfts, reverse=True)[:slowest]]}")
    show_overlaps(answered_of(real))
    return 0 if all(agree) else 1


class Answered(NamedTuple):
    """A real request's life as its client saw it: sent, first token, last token (seconds)."""
    sent_s: float
    first_s: float
    end_s: float


def by_overlap(answered: Iterable[Answered], most: int = 4) -> dict[int, list[float]]:
    """Each request's TTFT under the number of other requests in flight at any moment of
    its wait for the first token (from `most` on, together): the isolated ones show the
    warm path the calibration timed; the rest, what concurrency adds to it."""
    lives = sorted(answered)
    found: dict[int, list[float]] = {}
    for i, a in enumerate(lives):
        others = sum(1 for j, b in enumerate(lives)
                     if j != i and b.sent_s < a.first_s and b.end_s > a.sent_s)
        found.setdefault(min(others, most), []).append(a.first_s - a.sent_s)
    return dict(sorted(found.items()))


def show_overlaps(answered: Iterable[Answered], most: int = 4) -> None:
    print("real TTFT p50 by the other requests in flight while it waited for its first token:")
    for others, ttfts in by_overlap(answered, most).items():
        label = f"{others}+" if others == most else str(others)
        print(f"  {label:>3} others  {len(ttfts):5d} requests  p50 {statistics.median(ttfts) * 1000:6.1f} ms")


def answered_ttfts(real: RealRun) -> "array[float]":
    """The client's TTFT of every answered real request, in seconds."""
    return array("d", [s.answer.ttft_s for s in real.sent if s.answer.ok and s.answer.ttft_s is not None])


def answered_of(real: RealRun) -> list[Answered]:
    return [Answered(s.request.at_s, s.request.at_s + s.answer.ttft_s, s.request.at_s + s.answer.total_s)
            for s in real.sent if s.answer.ok and s.answer.ttft_s is not None]


def read_answered(path: Path) -> list[Answered]:
    """real_requests.jsonl (write_run) as Answered, the answered ones."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Answered(r["at_s"], r["at_s"] + r["ttft_s"], r["at_s"] + r["total_s"])
            for r in rows if r["status"] == 200 and r["ttft_s"] is not None]


def show_runs(real: RealRun, sim: Simulation, answered: int) -> None:
    failed = [s.answer for s in real.sent if not s.answer.ok]
    late = sorted(s.late_s for s in real.sent)
    cpu = real.cpu
    ours = sum(v for k, v in cpu.items() if not k.startswith("machine"))
    print(f"\nreal: {len(real.sent)} requests, {answered} answered, {len(failed)} failed "
          f"{sorted({(a.status, a.error[:80]) for a in failed})[:3]}; sent late by at most {late[-1] * 1000:.0f} ms")
    print(f"real, CPU over the replay: the machine busy {cpu['machine busy']:.0f} of {cpu['machine']:.0f} "
          "core-seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items() if not k.startswith("machine"))
          + f", other work {cpu['machine busy'] - ours:.0f}")
    reasons: dict[str, int] = {}
    for replica in real.replicas:
        why = str(replica["reason"] or "running at the end").split(":")[0]
        reasons[why] = reasons.get(why, 0) + 1
    print(f"real replicas by why they stopped: {dict(sorted(reasons.items()))}")
    out = sim.tally
    print(f"sim:  {sum(d.requests for d in out.deployments.values())} requests, {len(out.ttft)} answered, "
          f"{out.timed_out} timed out, {out.rejected} refused; cold starts by tier {out.cold_starts}; "
          f"served by tier {out.served_by_tier}")


def show_kind(gpu: GpuKind, timings: Timings) -> None:
    raw = to_json(gpu)
    print(f"calibrated kind {gpu.name}: {raw['source']}")
    print("  cold_starts", json.dumps(raw["cold_starts"]))
    print("  throughput ", json.dumps(raw["throughput"]))
    for name, values in calibration_probes.summary(timings).items():
        print(f"  measured {name}: {values}")


# ------------------------------------------------------------------ the run


async def validate(args: argparse.Namespace, root: Path) -> int:
    calibration = [make_model(root / f"calib-{i}", MODEL, seed=100 + i) for i in range(3)]
    shape, settings = model_shape(calibration[0]), scaling(args.idle_timeout)
    OUT.mkdir(parents=True, exist_ok=True)
    write_trace(scaled_trace(args, shape), OUT / "requests.jsonl", OUT / "deployments.json")
    trace = read_trace(OUT / "requests.jsonl", OUT / "deployments.json")
    models = {d.name: make_model(root / d.name, MODEL, seed=i) for i, d in enumerate(trace.deployments)}
    stack = FaultStack(root / "stack", cpu_slots=args.slots, env=STACK_ENV)
    try:
        await asyncio.to_thread(stack.start)
        calibrating = replace(settings, idle_timeout_s=calibration_probes.IDLE_S)
        timings = await calibration_probes.measure(
            stack, [stack.upload(m, f"calib-{i}") for i, m in enumerate(calibration)], calibration[0],
            MODEL.vocab_size, shape.parameters_b * 1e9, deployer(stack, calibrating),
            PoolSettings().standby_refill_delay_s)
        machine = Machine("cpu-local", args.slots, SLOT_MEMORY_GB, cores=os.cpu_count() or 1,
                          prefill_step_tokens=EngineOptions().max_num_batched_tokens)
        await settled(stack, [calibration_probes.TENANT])
        cal_trace = scaled_trace(args, shape, calibration=True)
        cal_uris = {d.name: stack.upload(make_model(root / d.name, MODEL, seed=50 + i), d.name)
                    for i, d in enumerate(cal_trace.deployments)}
        cal_real = await run(stack, cal_trace, cal_uris, settings, MODEL.vocab_size)
        gpu = fitted(kind(timings, machine), cal_trace, cal_real, settings)
        (OUT / "cpu-local.json").write_text(json.dumps(to_json(gpu), indent=2) + "\n")
        show_kind(gpu, timings)
        uris = {name: stack.upload(m, name) for name, m in models.items()}
        await settled(stack, sorted({d.tenant for d in cal_trace.deployments}))
        real = await run(stack, trace, uris, settings, MODEL.vocab_size)
    finally:
        await asyncio.to_thread(stack.close)
    print(f"\ntrace: {args.deployments} deployments over {args.tenants} tenants, {args.duration:g} s, seed "
          f"{args.seed} (calibration replay: {args.calibration_duration:g} s, arrivals from seed "
          f"{args.seed + CALIBRATION_SEED_OFFSET}), rate scale {args.rate_scale:g}; idle timeout "
          f"{args.idle_timeout:g} s, {args.slots} CPU slots, one standby, no sleep tier, caches cold; files in "
          f"{OUT.relative_to(ROOT)}/")
    write_run(real, OUT / "real_requests.jsonl", OUT / "real_replicas.jsonl")
    return report(trace, real, run_sim(trace, gpu, settings))


async def settled(stack: FaultStack, tenants: list[str]) -> None:
    """Until these tenants' replicas have stopped and a standby is up: the next replay
    starts from caches and a pool as cold as the simulator's."""
    async def none_open() -> bool:
        return await open_replicas(stack, tenants) == 0
    await calibration_probes.until(none_open, f"the replicas of {tenants} stopped")
    await calibration_probes.until(lambda: asyncio.to_thread(standby_ready, stack), "a standby ready")


def main() -> int:
    args = parse_args()
    if args.overlaps is not None:
        show_overlaps(read_answered(args.overlaps))
        return 0
    with tempfile.TemporaryDirectory(prefix="thawpool-simval-") as root:
        return asyncio.run(validate(args, Path(root)))


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        sys.exit(main())
