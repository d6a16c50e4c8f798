"""Cold start from zero: request -> first token, by stage, weight cache cold and warm.

    .venv/bin/python benchmarks/cold_start.py [--s3-rate-mbps 80] [--layers 6 --hidden 768 ...]

Starts its own SeaweedFS S3, writes a ~200 MB Llama with random fp32 weights,
uploads it, and measures in the same run:

  pool, cache cold   acquire() from zero -> /v1/completions first streamed token
  pool, cache warm   the same after scale to zero (the weights are in the cache)
  pool download      WeightStore.fetch_model into an empty cache (parallel ranged GETs)
  peer: boto3        `s3.download_file` per file: boto3's managed download
                     (TransferManager with its default TransferConfig: files past 8 MB
                     in 8 MB ranged GETs on up to 10 threads), as a boto3 user would
  peer: bare load    a fresh `python -c "import torch; load_file(...)"` process

the two downloads twice: from SeaweedFS on loopback, and through a throttling
proxy (tests/support/throttle_proxy.py) that caps each connection at
--s3-rate-mbps, as AWS S3 does (one connection gets roughly 50-100 MB/s there).
The cold starts read S3 through the proxy too (bare loopback with --s3-rate-mbps 0).
It prints the download ratio pool / boto3 both ways, loopback and throttled, side by
side, against the targets (throttled >= 4x, loopback >= 2x; set against a single
stream, which the managed download is not), and the warm-cache cold start against
the bare import+load (target: within 1.5x).

Conditions that matter. The warm-cache cold start is served by the pool's warm
standby (warm_pool_size=1): a runtime process started ahead of time, torch and the
runtime already imported, that only loads the weights; the peer is a fresh
interpreter that must import torch first. So the ratio credits the standby with the
import time, which is the point of keeping one, but it is not a like-for-like load.
Both read files that were just written (the page cache is warm). On bare loopback the
download rates measure CPU and disk, not a network; through the proxy the pool's rate
is capped at its connections times the rate, and below that by the CPU that the client
(this process), the proxy (a process of its own) and SeaweedFS share: the report prints
how busy this process was. MB is 2**20 bytes, the rate too. The median of --trials,
every trial printed.
The report, with the machine's details, is also written to benchmarks/results/cold_start.txt.
Multipart uploads carry `<md5>-<n>` ETags, so these files are verified by size.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack, nullcontext
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.rounds import median_round, shown  # noqa: E402
from spec.engine_options import ChosenOptions  # noqa: E402
from pool.api import RevisionSpec  # noqa: E402
from pool.in_memory import EventLog, InMemoryDesiredState  # noqa: E402
from pool.manager import PoolManager  # noqa: E402
from pool.replica_http import ReplicaTransport  # noqa: E402
from pool.s3 import open_client  # noqa: E402
from pool.settings import PoolSettings  # noqa: E402
from pool.weights.cache import WeightCache  # noqa: E402
from pool.weights.store import WeightStore  # noqa: E402
from tests.support.throttle_process import ProxyProcess  # noqa: E402
from tests.support.throttle_proxy import through  # noqa: E402

MB = 1024 * 1024


def model_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The random Llama's shape (`build_model`): ~200 MB in fp32 by default."""
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    return p


def parse_args():
    p = model_args(argparse.ArgumentParser(description=__doc__,
                                           formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--part-size-mb", type=float, default=8.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--s3-rate-mbps", type=float, default=80.0,
                   help="throttled S3: each connection's cap in MB/s (0: no throttled case)")
    p.add_argument("--s3-first-byte-ms", type=float, default=0.0,
                   help="throttled S3: each answer's first byte held this long")
    p.add_argument("--trials", type=int, default=3, help="peer and download trials (the median is reported)")
    p.add_argument("--workdir", type=Path, default=None)
    return p.parse_args()


def build_model(args, workdir: Path) -> Path:
    from tests.support.model_factory import ModelSpec, make_model

    spec = ModelSpec(hidden_size=args.hidden, intermediate_size=args.intermediate,
                     num_hidden_layers=args.layers, num_attention_heads=args.heads,
                     num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                     max_position_embeddings=1024)
    return make_model(workdir / "model", spec)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def boto3_download(client, bucket: str, prefix: str, dest: Path) -> float:
    """Every file with boto3's managed download, its default transfer config."""
    dest.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for obj in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
        client.download_file(bucket, obj["Key"], str(dest / obj["Key"].rsplit("/", 1)[-1]))
    return time.perf_counter() - start


def bare_import_and_load(model_dir: Path) -> float:
    code = ("import glob, torch; from safetensors.torch import load_file; "
            f"[load_file(p) for p in glob.glob({str(model_dir)!r} + '/*.safetensors')]")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


async def pool_download(settings: PoolSettings, uri: str, cache_dir: Path) -> tuple[float, float]:
    """Seconds of fetch_model into an empty cache, and this process's CPU seconds meanwhile."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    async with AsyncExitStack() as stack:
        client = await open_client(settings, stack)
        store = WeightStore(client, WeightCache(cache_dir, settings.cache_budget_bytes), settings)
        cpu_started = time.process_time()
        files = await store.fetch_model(uri)
        return files.seconds, time.process_time() - cpu_started


def throttle(s3, args) -> ProxyProcess:
    """The proxy in a process of its own: in this one it would wait on the client's GIL."""
    return ProxyProcess(s3.port, rate_bytes_per_s=args.s3_rate_mbps * MB,
                        first_byte_latency_s=args.s3_first_byte_ms / 1000)


async def throttled_downloads(s3, args, settings: PoolSettings, uri: str, workdir: Path) -> dict:
    """Both downloads through the proxy, each trial with a proxy of its own (so its
    connection counts are that download's); interleaved, the median trial of each."""
    boto_runs, pool_runs = [], []
    for i in range(args.trials):
        with throttle(s3, args) as proxy:
            seconds = boto3_download(through(proxy, s3).client(), "bench", "m/model/", workdir / f"tboto{i}")
        boto_runs.append((seconds, proxy.stats.connections))   # stats: once the proxy has stopped
        with throttle(s3, args) as proxy:
            seconds, cpu_s = await pool_download(settings.with_(s3_endpoint=proxy.endpoint), uri, workdir / f"tdl{i}")
        pool_runs.append((seconds, cpu_s, proxy.stats.connections, proxy.stats.peak_open))
    print("throttled trials (s): boto3", [round(r[0], 3) for r in boto_runs],
          "pool", [round(r[0], 3) for r in pool_runs])
    boto_s, boto_conns = median_round(boto_runs, key=lambda r: r[0])
    pool_s, cpu_s, pool_conns, peak = median_round(pool_runs, key=lambda r: r[0])
    return {"rate_mbps": args.s3_rate_mbps, "first_byte_ms": args.s3_first_byte_ms,
            "boto3_s": boto_s, "boto3_connections": boto_conns, "download_s": pool_s,
            "download_cpu_s": cpu_s, "download_connections": pool_conns, "download_peak_open": peak,
            "download_speedup": boto_s / pool_s}


async def first_token(lease) -> float:
    body = {"model": lease.revision_id, "prompt": "Hello", "max_tokens": 1,
            "temperature": 0.0, "stream": True}
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, headers=dict(lease.headers), transport=ReplicaTransport()) as client:
        async with client.stream("POST", f"{lease.base_url}/v1/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if line.startswith("data:") and '"text"' in line:
                    return time.perf_counter() - start
    raise RuntimeError("no token streamed")


async def wait_warm(manager: PoolManager, timeout_s: float = 300) -> None:
    backend = manager.backend
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(w.ready.done() and not w.ready.exception() for w in backend._warm if w.process.is_alive()):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("warm pool did not fill")


async def wait_zero(manager: PoolManager, revision_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if manager.revision_status(revision_id).state == "scaled_to_zero":
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("did not scale to zero")


async def cold_start_once(manager: PoolManager, spec: RevisionSpec) -> dict:
    start = time.perf_counter()
    lease = await manager.acquire(spec, request_id=uuid.uuid4().hex, prefix_key=None,
                                  prompt_tokens=1, timeout_s=600)
    async with lease:
        token_s = await first_token(lease)
    total = time.perf_counter() - start
    cs = lease.cold_start
    stages = cs.placement_s + cs.download_s + cs.load_s
    return {"queue_s": max(0.0, lease.queue_s - stages), "placement_s": cs.placement_s,
            "download_s": cs.download_s, "load_s": cs.load_s, "first_token_s": token_s, "total_s": total}


async def pool_cold_starts(settings: PoolSettings, uri: str, proxy: Optional[ProxyProcess]) -> tuple[dict, dict]:
    """Cache cold, then warm; S3 read through `proxy` when there is one."""
    if proxy is not None:
        settings = settings.with_(s3_endpoint=proxy.endpoint)
    spec = RevisionSpec(revision_id="bench-rev", deployment_id="bench", tenant_id="bench",
                        model_uri=uri, gpu_memory_gb=0, idle_timeout_s=1.0,
                        engine=ChosenOptions({"kv_cache_tokens": 1024}))
    manager = PoolManager(settings, InMemoryDesiredState([spec]), EventLog())
    await manager.start()
    try:
        await wait_warm(manager)
        cold = await cold_start_once(manager, spec)
        await wait_zero(manager, spec.revision_id)
        await wait_warm(manager)
        warm = await cold_start_once(manager, spec)
        return cold, warm
    finally:
        await manager.stop()


def rate(size: int, seconds: float) -> str:
    return f"{size / MB / seconds:8.1f} MB/s"


PEER = "peer: boto3 download_file"


def report_loopback(size: int, boto_s: float, download_s: float, bare_s: float) -> float:
    print(f"\nmodel: {size / MB:.1f} MB in S3 (SeaweedFS on loopback)")
    print(f"{PEER:34s} {boto_s:7.3f} s {rate(size, boto_s)}")
    print(f"{'pool: parallel ranged download':34s} {download_s:7.3f} s {rate(size, download_s)}")
    print(f"{'peer: fresh python import+load':34s} {bare_s:7.3f} s")
    speedup = boto_s / download_s
    print(f"download speed vs boto3 download_file, loopback: {speedup:.2f}x (target >= 2x) "
          f"{'OK' if speedup >= 2 else 'BELOW TARGET'}")
    return speedup


def report_throttled(size: int, t: dict) -> None:
    cap = t["rate_mbps"] * t["download_peak_open"]
    print(f"\nthrottled S3: {t['rate_mbps']:g} MB/s per connection, first byte +{t['first_byte_ms']:g} ms "
          "(proxy in front of the same SeaweedFS)")
    print(f"{PEER:34s} {t['boto3_s']:7.3f} s {rate(size, t['boto3_s'])}"
          f"   {t['boto3_connections']} connection(s)")
    print(f"{'pool: parallel ranged download':34s} {t['download_s']:7.3f} s {rate(size, t['download_s'])}"
          f"   {t['download_connections']} connections, {t['download_peak_open']} at once")
    print(f"pool: the proxy allows {cap:.0f} MB/s over its connections; this process (the client) "
          f"used {t['download_cpu_s'] / t['download_s']:.0%} of a core meanwhile")
    speedup = t["download_speedup"]
    print(f"download speed vs boto3 download_file, both throttled: {speedup:.2f}x (target >= 4x) "
          f"{'OK' if speedup >= 4 else 'BELOW TARGET'}")


def report_stages(cold: dict, warm: dict, bare_s: float, s3_label: str) -> float:
    print(f"\n{'stage (s)':14s} {'cache cold':>11s} {'cache warm':>11s}   (S3: {s3_label})")
    for key in ("queue_s", "placement_s", "download_s", "load_s", "first_token_s", "total_s"):
        print(f"{key:14s} {cold[key]:11.3f} {warm[key]:11.3f}")
    ratio = warm["total_s"] / bare_s
    print(f"warm-cache cold start / bare import+load: {ratio:.2f}x (target <= 1.5x) "
          f"{'OK' if ratio <= 1.5 else 'ABOVE TARGET'}")
    return ratio


def s3_label(args) -> str:
    if not args.s3_rate_mbps:
        return "SeaweedFS on loopback"
    return f"through the proxy, {args.s3_rate_mbps:g} MB/s per connection"


def bench_settings(s3, args, workdir: Path) -> PoolSettings:
    env = s3.env()
    return PoolSettings(
        accelerator="cpu", cpu_slots=1, slot_memory_gb=8, cache_dir=workdir / "cache",
        s3_endpoint=env["THAWPOOL_S3_ENDPOINT"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], part_size_mb=args.part_size_mb,
        download_concurrency=args.concurrency, warm_pool_size=1, tick_s=0.2,
        scale_down_delay_s=0.5, kv_cache_tokens_default=1024)


async def loopback_downloads(s3, args, settings: PoolSettings, uri: str, workdir: Path) -> tuple[float, float]:
    """Median boto3 and pool seconds from SeaweedFS directly."""
    boto_runs, pool_runs = [], []
    for i in range(args.trials):             # interleaved, so both see the same machine load
        boto_runs.append(boto3_download(s3.client(), "bench", "m/model/", workdir / f"boto{i}"))
        pool_runs.append((await pool_download(settings, uri, workdir / f"dl{i}"))[0])
    print("trials (s): boto3", [round(t, 3) for t in boto_runs], "pool", [round(t, 3) for t in pool_runs])
    return statistics.median(boto_runs), statistics.median(pool_runs)


async def measure(args, s3, model: Path, workdir: Path) -> None:
    from tests.support.model_factory import upload_model

    size = folder_bytes(model)
    s3.ensure_bucket("bench")
    uri = upload_model(model, s3.client(), "bench", "m/model")
    settings = bench_settings(s3, args, workdir)
    boto_s, download_s = await loopback_downloads(s3, args, settings, uri, workdir)
    throttled = (await throttled_downloads(s3, args, settings, uri, workdir)) if args.s3_rate_mbps else None
    bare_runs = [bare_import_and_load(workdir / "boto0") for _ in range(args.trials)]
    print(f"bare import+load (s): {shown(bare_runs)}")
    bare_s = statistics.median(bare_runs)
    with throttle(s3, args) if args.s3_rate_mbps else nullcontext() as proxy:
        cold, warm = await pool_cold_starts(settings, uri, proxy)
    speedup = report_loopback(size, boto_s, download_s, bare_s)
    if throttled:
        report_throttled(size, throttled)
        print(f"\ndownload speed vs boto3 download_file: {speedup:.2f}x on loopback, "
              f"{throttled['download_speedup']:.2f}x throttled to {args.s3_rate_mbps:g} MB/s per connection")
    ratio = report_stages(cold, warm, bare_s, s3_label(args))
    print(json.dumps({"model_mb": round(size / MB, 1), "peer": "boto3 download_file", "boto3_s": boto_s,
                      "download_s": download_s,
                      "bare_load_s": bare_s, "cold": cold, "warm": warm, "download_speedup": speedup,
                      "warm_vs_bare": ratio, "throttled": throttled, "s3_for_cold_starts": s3_label(args)},
                     default=float))


async def main() -> None:
    args = parse_args()
    from controlplane.embedded import EmbeddedS3

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="thawpool-bench-"))
    model = build_model(args, workdir)
    s3 = EmbeddedS3(workdir / "s3").start()
    try:
        await measure(args, s3, model, workdir)
    finally:
        s3.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        asyncio.run(main())
