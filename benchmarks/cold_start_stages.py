"""Where a replica's cold start goes, stage by stage, against the time to read its weights.

    .venv/bin/python benchmarks/cold_start_stages.py [--model DIR] [--trials 3]

The model is the real one by default (SmolLM2-135M, fp32, ~540 MB; `make model`). Each
trial starts a fresh Python process per case and measures in it:

  fresh     process start -> import -> kernels -> ... -> ready, as `runtime.serve.server --model`
  standby   the same load in a process that already ran the standby warm-up (imports,
            kernels): what a pool with a warm standby pays once a load is asked for
  packed    a standby whose node has loaded the model before: its layers are mapped from
            the node's packed-layer cache (runtime/load/packed_weights.py) instead of packed
            (the cache is filled by one load before the trials)
  replica   the whole replica as a pool on a node that served the model before has it
            from a warm standby: the server's model host with its warmed engine-core
            process and the node's packed-layer cache (as pool/backends/runtime_args.py
            configures CPU replicas), from the load request to ready (the core loading
            while the server parses its tokenizer, and the pipe between them), then the
            first token through the engine client: a standby not told the model (the
            pool's prediction wrong, or none)
  told      the same replica, its standby told the model ahead (/admin/likely: the pool's
            prediction right), so its tokenizer was parsed before the load request

then one greedy token (first_token). The peer, measured in the same run and between the
cases: reading the weight files into memory with plain `read()` from the page cache (warm:
every case reads files that were just read). The figure printed per case is
(time to ready) / (read time), the issue's target being about 1x; `other` is the part of
ready that no stage recorded. The median trial (by ready) of --trials per case, and the
median read; every trial's ready and read are printed. On a busy machine only the ratios
within one run mean anything. The report is also written to
benchmarks/results/cold_start_stages.txt.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rounds import median_round, shown  # noqa: E402

CHILD = """
import json, sys, time
model, mode, packed_dir = sys.argv[1], sys.argv[2], sys.argv[3]
from runtime.serve.model_host import build_llm_engine, warm_imports
from wire.replica_control import LoadRequest
if mode != "fresh":
    warm_imports("cpu")
options = {"packed_cache_dir": packed_dir} if mode == "packed" else {}
engine, timings = build_llm_engine(LoadRequest(model, "bench", options))
from wire.sampling import SamplingParams
ids = engine.tokenizer.encode("Hello")   # the server's, parsed beside the load (replica)
since = time.perf_counter()
engine.add_request("0", ids, SamplingParams(max_tokens=1))
while engine.has_unfinished_requests():
    engine.step()
first_token_s = time.perf_counter() - since
writer = engine.runner.model.packed_writer
if writer is not None:
    writer.result()          # a load that packed fills the cache for the next
print(json.dumps({"timings": timings, "first_token_s": first_token_s}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="model folder (default: SmolLM2-135M)")
    p.add_argument("--trials", type=int, default=3, help="odd, so the median is a trial")
    return p.parse_args(argv)


def weight_paths(model: Path) -> list[Path]:
    return sorted(model.glob("*.safetensors"))


def read_seconds(paths: list[Path]) -> float:
    """Plain read() of every weight file into memory: the peer."""
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            f.read()
    return time.perf_counter() - start


REPLICA = """
import asyncio, json, sys, time
model, mode, packed_dir = sys.argv[1], sys.argv[2], sys.argv[3]
from runtime.serve.model_host import ModelHost, Status
from wire.replica_control import LoadRequest
from wire.sampling import SamplingParams

async def main():
    host = ModelHost()
    await host.warm()
    if mode == "told":                        # as the pool tells a standby, well before the load
        host.prepare((model,))
        await host.tokenizers.settled()
    host.start_loading(LoadRequest(model, "bench", {"packed_cache_dir": packed_dir}))
    while host.status is Status.LOADING:      # as the pool polls /health
        await asyncio.sleep(0.001)
    loaded = host.model
    assert loaded is not None, host.error
    since = time.perf_counter()
    ids = loaded.serving.tokenizer.encode("Hello")
    async with await loaded.engine.add("0", ids, SamplingParams(max_tokens=1)) as stream:
        async for _ in stream:
            pass
    first_token_s = time.perf_counter() - since
    await loaded.engine.stop()
    timings = host.load_timings      # the server's own total_s and other_s
    print(json.dumps({"timings": timings, "first_token_s": first_token_s}))

asyncio.run(main())
"""


def run_case(model: Path, mode: str, packed_dir: Path) -> dict:
    script = REPLICA if mode in ("replica", "told") else CHILD
    done = subprocess.run([sys.executable, "-c", script, str(model), mode, str(packed_dir)],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ready_s(result: dict) -> float:
    """From the process start (fresh) or the load request (standby) to ready."""
    return result["timings"]["total_s"]


def stage_rows(result: dict) -> dict[str, float]:
    """Seconds of every stage the replica recorded, `other` (what none of them covers),
    ready, and the first token after it."""
    rows = {k.removesuffix("_s"): v for k, v in result["timings"].items()
            if k.endswith("_s") and k != "total_s"}
    return {**rows, "ready": ready_s(result), "first_token": result["first_token_s"]}


def report(read_s: float, size: int, cases: dict[str, dict]) -> None:
    rows = {name: stage_rows(r) for name, r in cases.items()}
    names = list(dict.fromkeys(k for r in rows.values() for k in r))
    print(f"\nweights: {size / 1e6:.0f} MB; plain read() from the page cache: {read_s:.3f} s "
          f"({size / read_s / 1e9:.2f} GB/s)")
    print(f"\n{'stage (s)':16s}" + "".join(f"{c:>11s}" for c in rows))
    for name in names:
        print(f"{name:16s}" + "".join(f"{r.get(name, 0.0):11.3f}" for r in rows.values()))
    for c, r in cases.items():
        gbps = r["timings"].get("weights_gbps")
        rate = f"; weights stage at {gbps:.2f} GB/s" if gbps else ""
        first = (ready_s(r) + r["first_token_s"]) / read_s
        print(f"{c}: ready / read = {ready_s(r) / read_s:.2f}x (target about 1x){rate}; "
              f"first token / read = {first:.2f}x (issue 22: at most 1.5x with a warm standby)")
    print(json.dumps({"read_s": read_s, "weight_bytes": size, "cases": cases}))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model is None:
        from scripts.real_model import smollm2_dir
        args.model = smollm2_dir()
    paths = weight_paths(args.model)
    size = sum(p.stat().st_size for p in paths)
    read_seconds(paths)                           # warms the page cache
    reads: list[float] = []
    trials: dict[str, list[dict]] = {"fresh": [], "standby": [], "packed": [], "replica": [], "told": []}
    packed_dir = Path(tempfile.mkdtemp(prefix="thawpool-packed-"))
    run_case(args.model, "packed", packed_dir)   # fills the node's packed-layer cache
    for _ in range(args.trials):
        for mode, results in trials.items():
            results.append(run_case(args.model, mode, packed_dir))
            reads.append(read_seconds(paths))
    shutil.rmtree(packed_dir, ignore_errors=True)
    print(f"read (s): {shown(reads)}")
    for mode, results in trials.items():
        print(f"{mode} ready (s): {shown([ready_s(r) for r in results])}")
    report(statistics.median(reads), size, {mode: median_round(results, key=ready_s)
                                            for mode, results in trials.items()})


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
