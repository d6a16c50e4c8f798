"""The engine in the server process vs in an engine-core process of its own (`--engine-process`).

One workload (random prompts of exact lengths, greedy, ignore_eos) through:
  offline   runtime.LLM.generate, every request at once, in this process;
  served    python -m runtime.serve.server over HTTP, 32 streaming clients back to back
            (closed loop), with the flag off and on;
and, per server, TTFT p50 of requests sent one at a time (concurrency 1). Prints each
server's throughput as a ratio of the offline figure. The model is the random
BENCH_SPEC Llama of benchmarks/engine_throughput.py (about 50M parameters); the
engine gets --threads torch threads in every run (the server's HTTP side is on top).
The report is written to benchmarks/results/engine_process.txt.

    .venv/bin/python -m benchmarks.engine_process
    .venv/bin/python -m benchmarks.engine_process --models small --repeats 1
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.engine_throughput import BENCH_SPEC
from benchmarks.serve import RequestResult, Workload, offline_tok_s, one_request, start_replica

# the same vocabulary and context as BENCH_SPEC, the rest shrunk: steps of milliseconds
SMALL_SPEC = {**BENCH_SPEC, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}
SPECS = {"bench": BENCH_SPEC, "small": SMALL_SPEC}


async def closed_loop(url: str, workload: Workload, concurrency: int) -> tuple[list[RequestResult], float]:
    """Every request of the workload, at most `concurrency` in flight at once."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await one_request(client, None, workload.prompts[0], 4)   # warm-up, untimed

        async def gated(prompt: list[int], max_tokens: int) -> RequestResult:
            async with gate:
                return await one_request(client, None, prompt, max_tokens)

        start = time.perf_counter()
        results = await asyncio.gather(*(gated(p, n) for p, n in
                                         zip(workload.prompts, workload.output_lens)))
        return list(results), time.perf_counter() - start


def served(model_dir: Path, workload: Workload, args: argparse.Namespace, engine_process: bool
           ) -> dict[str, float]:
    flags = ["--kv-cache-tokens", str(args.kv_cache_tokens), "--max-num-seqs", str(args.concurrency),
             "--engine-process" if engine_process else "--no-engine-process"]
    replica = start_replica(model_dir, flags, args.threads)
    try:
        results, duration = asyncio.run(closed_loop(replica.url, workload, args.concurrency))
        single = Workload(workload.prompts[:args.ttft_requests],
                          [args.ttft_output_len] * args.ttft_requests)
        singles, _ = asyncio.run(closed_loop(replica.url, single, 1))
    finally:
        replica.stop()
    failed = [r.error for r in results + singles if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} request(s) failed, first: {failed[0]}")
    return {"tok_s": sum(r.output_tokens for r in results) / duration,
            "ttft_p50_ms": 1000 * statistics.median(r.ttft_s for r in singles)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", choices=list(SPECS), default=list(SPECS),
                   help="bench: BENCH_SPEC (about 50M parameters); small: steps of milliseconds")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[32, 96], metavar=("MIN", "MAX"))
    p.add_argument("--concurrency", type=int, default=32, help="clients (and max_num_seqs)")
    p.add_argument("--ttft-requests", type=int, default=16, help="sent one at a time")
    p.add_argument("--ttft-output-len", type=int, default=4)
    p.add_argument("--kv-cache-tokens", type=int, default=32768)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    p.add_argument("--repeats", type=int, default=2, help="rounds of offline, off, on")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workload = Workload.random(args.num_prompts, tuple(args.input_len), tuple(args.output_len),
                               BENCH_SPEC["vocab_size"], args.seed)
    print(f"workload: {args.num_prompts} requests, prompts {args.input_len}, outputs "
          f"{args.output_len} ({sum(workload.output_lens)} tokens), concurrency "
          f"{args.concurrency}, {args.threads} engine thread(s)")
    for name in args.models:
        print(f"\nmodel {name}: {SPECS[name]}")
        report(compare(name, workload, args))


def compare(name: str, workload: Workload, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    from tests.support.model_factory import make_model

    rows: dict[str, list[dict[str, float]]] = {"offline": [], "thread": [], "process": []}
    with tempfile.TemporaryDirectory(prefix="engine-process-bench-") as tmp:
        model_dir = make_model(Path(tmp) / name, **SPECS[name])
        for _ in range(args.repeats):   # interleaved, so drift in the machine's load is shared
            offline = offline_tok_s(model_dir, workload, {"kv_cache_tokens": args.kv_cache_tokens,
                                                          "max_num_seqs": args.concurrency},
                                    args.threads)
            rows["offline"].append({"tok_s": offline})
            rows["thread"].append(served(model_dir, workload, args, engine_process=False))
            rows["process"].append(served(model_dir, workload, args, engine_process=True))
    return rows


def report(rows: dict[str, list[dict[str, float]]]) -> None:
    offline = statistics.median(r["tok_s"] for r in rows["offline"])
    print(f"{'run':<28}{'tok/s':>10}{'x offline':>11}{'TTFT p50 c=1 (ms)':>20}")
    print(f"{'offline LLM.generate':<28}{offline:>10.1f}{1.0:>11.3f}{'-':>20}")
    for name, label in (("thread", "server, engine in thread"),
                        ("process", "server, --engine-process")):
        tok_s = statistics.median(r["tok_s"] for r in rows[name])
        ttft = statistics.median(r["ttft_p50_ms"] for r in rows[name])
        print(f"{label:<28}{tok_s:>10.1f}{tok_s / offline:>11.3f}{ttft:>20.1f}")
    print("each figure: the median over rounds; per round:")
    for name, runs in rows.items():
        print(f"  {name:<8} " + "  ".join(" ".join(f"{k}={v:.1f}" for k, v in r.items()) for r in runs))


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
