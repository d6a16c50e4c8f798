"""Wake from sleep vs warm-cache cold start: request -> first token, by stage.

    .venv/bin/python benchmarks/sleep_wake.py [--trials 3] [--layers 6 --hidden 768 ...]

Starts its own SeaweedFS S3, writes a ~200 MB Llama with random fp32 weights (the
model of benchmarks/cold_start.py), uploads it, and measures through the real pool
(PoolManager, local backend, one slot), in the same run and interleaved:

  warm-cache cold start   a revision with no sleep tier, scaled to zero, thawed by a
                          request: served by the warm standby (torch imported ahead
                          of time), weights from the pool's warm cache and page cache
  wake from sleep         a revision with `sleep_timeout_s`, asleep after its idle
                          timeout (its process and weights kept, its slot given back),
                          woken by a request: POST /wake, then the request

Both are timed from acquire() to the first streamed token, with the stages the pool
records (ColdStartTimings: queue, placement, download, load; for a wake, load is its
time in `waking`, inside which the replica's own stages are weights_s host -> device
and kv_cache_s) and the first token. It prints the ratio wake / cold start against
the target (<= 0.25x). Idle timeouts are passed by stepping the pool's clock.

Conditions that matter. On a CPU machine the weights of a sleeper stay where they
are (runtime/core/sleep_mode.py), so a wake there is the KV cache allocated again and the
pool's own path (slot claimed, /wake, routing); on CUDA the wake also copies the
weights from pinned host memory back (about 200 MB here: tens of ms at PCIe rates).
The report prints which one this was. The median trial of each (by total; every
trial's total printed).
The report, with the machine's details, is also written to benchmarks/results/sleep_wake.txt.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cold_start import build_model, first_token, model_args  # noqa: E402  (the same model, the same token)
from benchmarks.rounds import median_round  # noqa: E402
from spec.engine_options import ChosenOptions  # noqa: E402
from pool.api import RevisionSpec  # noqa: E402
from pool.in_memory import EventLog, InMemoryDesiredState  # noqa: E402
from pool.manager import PoolManager  # noqa: E402
from pool.settings import PoolSettings  # noqa: E402
from tests.support.clock import SteppedClock  # noqa: E402

MB = 1024 * 1024
TARGET = 0.25
STAGES = ("queue_s", "placement_s", "download_s", "load_s", "first_token_s", "total_s")


def parse_args() -> argparse.Namespace:
    p = model_args(argparse.ArgumentParser(description=__doc__,
                                           formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=None, help="keep files here (default: a temp dir)")
    return p.parse_args()


def bench_settings(s3: Any, workdir: Path) -> PoolSettings:
    env = s3.env()
    return PoolSettings(
        accelerator="auto", cpu_slots=1, slot_memory_gb=8, cache_dir=workdir / "cache",
        s3_endpoint=env["THAWPOOL_S3_ENDPOINT"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], warm_pool_size=1, tick_s=0.1,
        kv_cache_tokens_default=1024)


def spec(uri: str, name: str, sleep_timeout_s: float) -> RevisionSpec:
    return RevisionSpec(revision_id=f"bench-{name}", deployment_id=name, tenant_id="bench",
                        model_uri=uri, gpu_memory_gb=0, idle_timeout_s=1.0,
                        sleep_timeout_s=sleep_timeout_s, engine=ChosenOptions({"kv_cache_tokens": 1024}))


async def thaw(manager: PoolManager, revision: RevisionSpec) -> dict[str, Any]:
    """acquire() -> first token, with the stages of the thaw it waited for."""
    start = time.perf_counter()
    lease = await manager.acquire(revision, request_id=uuid.uuid4().hex, prefix_key=None,
                                  prompt_tokens=1, timeout_s=600)
    async with lease:
        token_s = await first_token(lease)
    total = time.perf_counter() - start
    cs = lease.cold_start
    if cs is None:
        raise RuntimeError(f"{revision.revision_id}: the request found a ready replica")
    stages = cs.placement_s + cs.download_s + cs.load_s
    return {"kind": cs.kind, "queue_s": max(0.0, lease.queue_s - stages), "placement_s": cs.placement_s,
            "download_s": cs.download_s, "load_s": cs.load_s, "first_token_s": token_s, "total_s": total,
            "replica_stages": dict(cs.load_stages)}


async def until(what: str, check: Any, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g}s")
        await asyncio.sleep(0.05)


def warm_standby(manager: PoolManager) -> bool:
    backend: Any = manager.backend          # the local backend's standby processes
    return any(w.ready.done() and not w.ready.exception() for w in backend._warm if w.process.is_alive())


async def idle_into(manager: PoolManager, revision: RevisionSpec, state: str) -> None:
    """Past the idle timeout (the pool's clock stepped), until the revision is in `state`."""
    clock = manager.clock
    assert isinstance(clock, SteppedClock)
    clock.advance(2.0)
    await until(f"{revision.revision_id} {state}",
                lambda: manager.revision_status(revision.revision_id).state == state)


async def measure(manager: PoolManager, desired: InMemoryDesiredState, uri: str,
                  trials: int) -> tuple[list[dict], list[dict]]:
    plain, sleepy = spec(uri, "cold", 0.0), spec(uri, "sleepy", 1e6)
    desired.put(plain)
    desired.put(sleepy)
    await manager.refresh()
    await thaw(manager, sleepy)          # its first cold start fills the weight cache too
    await idle_into(manager, sleepy, "sleeping")
    colds, wakes = [], []
    for _ in range(trials):              # interleaved: both see the same machine load
        await until("a warm standby", lambda: warm_standby(manager))
        colds.append(await thaw(manager, plain))
        await idle_into(manager, plain, "scaled_to_zero")
        wakes.append(await thaw(manager, sleepy))
        await idle_into(manager, sleepy, "sleeping")
    return colds, wakes


def report(cold: dict, wake: dict, device: str) -> float:
    print(f"{'stage':18s} {'warm-cache cold':>16s} {'wake from sleep':>16s}")
    for key in STAGES:
        print(f"{key:18s} {cold[key]:14.3f} s {wake[key]:14.3f} s")
    print("replica stages, cold start:", json.dumps(cold["replica_stages"]))
    print("replica stages, wake:      ", json.dumps(wake["replica_stages"]))
    ratio = wake["total_s"] / cold["total_s"]
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"wake from sleep / warm-cache cold start (acquire -> first token): {ratio:.3f}x "
          f"(target <= {TARGET}x: {verdict}); replicas on {device}")
    return ratio


async def main() -> None:
    args = parse_args()
    from controlplane.embedded import EmbeddedS3
    from tests.support.model_factory import upload_model

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="thawpool-sleep-bench-"))
    model = build_model(args, workdir)
    size = sum(f.stat().st_size for f in model.iterdir() if f.is_file())
    s3 = EmbeddedS3(workdir / "s3").start()
    try:
        s3.ensure_bucket("bench")
        uri = upload_model(model, s3.client(), "bench", "m/model")
        desired = InMemoryDesiredState()
        manager = PoolManager(bench_settings(s3, workdir), desired, EventLog(), clock=SteppedClock())
        await manager.start()
        try:
            colds, wakes = await measure(manager, desired, uri, args.trials)
            device = manager.slots[0].kind
        finally:
            await manager.stop()
    finally:
        s3.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    cold = median_round(colds, key=lambda r: r["total_s"])
    wake = median_round(wakes, key=lambda r: r["total_s"])
    print(f"model: {size / MB:.1f} MB fp32 random Llama; the median of {args.trials} trials")
    print("trials (s): cold", [round(r["total_s"], 3) for r in colds],
          "wake", [round(r["total_s"], 3) for r in wakes])
    ratio = report(cold, wake, device)
    print(json.dumps({"model_mb": round(size / MB, 1), "device": device, "cold": cold,
                      "wake": wake, "ratio": ratio, "target": TARGET, "cold_trials": colds,
                      "wake_trials": wakes}, default=float))


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        asyncio.run(main())
