"""What the sandbox costs: the same function on a pool with it and one without.

    .venv/bin/python benchmarks/sandbox.py [--rounds 5] [--requests 512] [--hidden 1024]

Starts its own Postgres and S3 and two control planes with the real pool side by
side, each on its own database and cache: `sandbox` (bubblewrap, the default) and
`unconfined` (THAWPOOL_SANDBOX=off), the peer measured in the same run. Each deploys
the example text classifier (examples/functions/text-classifier, untrained, its MLP
`--hidden` wide) with one replica, and answers a first call (its venv built, its
files cached). Then, rounds taking turns between the two:

  cold start   a new deployment of the same package, one call (then deleted): the
               client's wall time of a cold start with the weights and the venv cached
               (issue 30's target: at most +10%)
  model cold start
               a new deployment of the real SmolLM2-135M (its Q4_1 GGUF, `make model`),
               one chat completion of 4 tokens (then deleted, its replica waited out
               and the warm standby refilled, so no refill shares the CPU with the
               next cold start): a warm standby takes the load, weights cached on the
               node (target: at most +5%)
  throughput   concurrency 32, `--requests` calls through the control plane, dynamic
               batching on (target: at least 0.97x)

A throughput pass and a model cold start of each before the rounds are not counted.
Printed: every round of both, the medians and the ratios sandbox / unconfined. The
report is also written to benchmarks/results/sandbox.txt.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "functions" / "text-classifier"))

import build  # noqa: E402  (the example's build script)

from benchmarks.dynamic_batching import TEXT, Clients  # noqa: E402
from controlplane.db import migrate_async  # noqa: E402
from controlplane.embedded import EmbeddedPostgres, EmbeddedS3  # noqa: E402
from tests.controlplane.conftest import (MODELS_BUCKET, cpu_pool_settings, create_database,  # noqa: E402
                                         make_settings, real_pool, running_control_plane)
from tests.functions.test_function_deploy import upload  # noqa: E402

MODES = {"sandbox": "bwrap", "unconfined": "off"}
MODEL_FILE = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"      # make model


class Side:
    """One control plane and its deployment."""

    def __init__(self, plane, client, uri: str, model_uri: str):
        self.plane, self.client, self.uri, self.model_uri = plane, client, uri, model_uri

    @property
    def url(self) -> str:
        return f"{self.plane.base_url}/v1/functions/classify/invoke"

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": self.client.headers["authorization"]}

    async def cold_call(self, name: str) -> float:
        made = await self.client.post("/v1/deployments", json={"name": name, "kind": "function",
                                                               "model_uri": self.uri})
        assert made.status_code == 201, made.text
        started = time.perf_counter()
        answer = await self.client.post(f"/v1/functions/{name}/invoke", json={"input": TEXT})
        seconds = time.perf_counter() - started
        assert answer.status_code == 200, answer.text
        assert (await self.client.delete(f"/v1/deployments/{name}")).status_code in (200, 202, 204)
        return seconds

    async def model_cold_call(self, name: str) -> float:
        made = await self.client.post("/v1/deployments", json={
            "name": name, "model_uri": self.model_uri, "resources": {"gpu_memory_gb": 1},
            "engine": {"kv_cache_tokens": 512}, "scaling": {"min_replicas": 0, "max_replicas": 1}})
        assert made.status_code == 201, made.text
        revision = made.json()["revisions"][0]["id"]
        started = time.perf_counter()
        answer = await self.client.post("/v1/chat/completions", json={
            "model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        seconds = time.perf_counter() - started
        assert answer.status_code == 200, answer.text
        assert (await self.client.delete(f"/v1/deployments/{name}")).status_code in (200, 202, 204)
        pool = self.plane.app.state.pool
        while pool.revision_status(revision).replicas:      # stopped: its slot free, its packs kept
            await asyncio.sleep(0.05)
        while pool.backend.standbys_ready < 1:                # refilled: the next cold start, either
            await asyncio.sleep(0.05)                         # side's, shares no CPU with a refill
        return seconds


async def side(stack, mode: str, folder: Path, uri_prefix: str, work: Path, stack_ctx) -> Side:
    pg, s3 = stack
    db_url = await create_database(pg)
    await migrate_async(db_url)
    settings = make_settings(db_url, s3, work / mode / "cp", acquire_timeout_s=300,
                             default_requests_per_min=10_000_000)
    pool = real_pool(cpu_pool_settings(s3, work / mode / "cache", cpu_slots=2, load_timeout_s=300,
                                       warm_pool_size=1, sandbox=MODES[mode]))
    plane = await stack_ctx.enter_async_context(running_control_plane(settings, pool_factory=pool))
    client = plane.client(await plane.tenant_key("bench"))
    uri = upload(folder, s3, MODELS_BUCKET, uri_prefix)
    made = await client.post("/v1/deployments", json={
        "name": "classify", "kind": "function", "model_uri": uri,
        "scaling": {"min_replicas": 1, "max_replicas": 1, "target_concurrency": 1000}})
    assert made.status_code == 201, made.text
    first = await client.post("/v1/functions/classify/invoke", json={"input": TEXT})
    assert first.status_code == 200, first.text
    s3.client().upload_file(str(MODEL_FILE), MODELS_BUCKET, f"{uri_prefix}/model/{MODEL_FILE.name}")
    return Side(plane, client, uri, f"s3://{MODELS_BUCKET}/{uri_prefix}/model/{MODEL_FILE.name}")


def report(name: str, unit: str, rounds: dict[str, list[float]], better_low: bool) -> None:
    for mode, values in rounds.items():
        print(f"{name} {mode:>10}: " + " ".join(f"{v:.3f}" for v in values)
              + f"  median {statistics.median(values):.3f} {unit}")
    ratio = statistics.median(rounds["sandbox"]) / statistics.median(rounds["unconfined"])
    print(f"{name} ratio sandbox / unconfined: {ratio:.3f}x "
          f"({'lower' if better_low else 'higher'} is better)\n", flush=True)


async def run(args, work: Path) -> None:
    from contextlib import AsyncExitStack

    pg = EmbeddedPostgres(work / "pg").start()
    s3 = EmbeddedS3(work / "s3").start()
    clients = Clients()
    try:
        s3.ensure_bucket(MODELS_BUCKET)
        folder = build.build(work / "package", hidden=args.hidden, steps=0)
        async with AsyncExitStack() as stack_ctx:
            sides = {mode: await side((pg, s3), mode, folder, f"bench/{mode}", work, stack_ctx)
                     for mode in MODES}
            print(f"example classifier, hidden {args.hidden}; {args.rounds} rounds; cold starts of a "
                  f"new deployment, cache warm; throughput at concurrency 32, {args.requests} calls\n")
            for mode in MODES:                      # warm-up: connections, batching, the allocator
                await clients.closed_loop(sides[mode].url, sides[mode].headers, 32, args.requests)
                await sides[mode].model_cold_call("model-warmup")   # the weights and packs cached
            cold: dict[str, list[float]] = {m: [] for m in MODES}
            model: dict[str, list[float]] = {m: [] for m in MODES}
            rate: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.rounds):
                order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
                for mode in order:
                    cold[mode].append(await sides[mode].cold_call(f"cold-{r}"))
                for mode in order:
                    model[mode].append(await sides[mode].model_cold_call(f"model-{r}"))
                for mode in order:
                    calls_s, _ = await clients.closed_loop(sides[mode].url, sides[mode].headers, 32,
                                                           args.requests)
                    rate[mode].append(calls_s)
            report("cold start (s)", "s", cold, better_low=True)
            report("model cold start (s)", "s", model, better_low=True)
            report("throughput (calls/s)", "calls/s", rate, better_low=False)
    finally:
        clients.pool.shutdown()
        s3.stop()
        pg.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="thawpool-sandbox-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    from benchmarks.results import recorded
    with recorded(__file__):
        main()
