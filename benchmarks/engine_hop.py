"""The replica server of two checkouts, side by side: TTFT at concurrency 1 and output
throughput at concurrency 32, in one run.

Both servers (`python -m runtime.serve.server` of each checkout, its own code on its own
PYTHONPATH, in its default mode) are started once on the same random model and stay up;
then each round measures one and then the other, the order swapped every round, so
drift in the machine's load falls on both alike. A round is one closed loop of
--num-prompts streaming requests (random prompts of exact lengths, greedy, ignore_eos)
at --concurrency clients (output tokens per second of wall time, and per CPU second of
the server and its engine core together), then --ttft-requests requests one at a time
(TTFT p50). The report gives, per checkout, the median over rounds; the median over rounds of
after/before; every round; and the commit each checkout was at. The model is
SMALL_SPEC, a Llama with the vocabulary and context of benchmarks/engine_throughput.py's
BENCH_SPEC and steps of milliseconds, so the server's own path is much of each request.
The report is written to benchmarks/results/engine_hop.txt.

    git worktree add --detach /tmp/hop-before <commit>
    .venv/bin/python -m benchmarks.engine_hop --before /tmp/hop-before
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.engine_throughput import BENCH_SPEC
from benchmarks.serve import REPO, Replica, RequestResult, Workload, one_request, start_replica

SMALL_SPEC = {**BENCH_SPEC, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}
SIDES = ("before", "after")


@dataclass(frozen=True)
class Served:
    """One checkout's replica: the server, and the processes whose CPU time it spends."""
    replica: Replica
    pids: tuple[int, ...]       # the server and its engine core

    @classmethod
    def start(cls, model_dir: Path, flags: list[str], threads: int, repo: Path) -> "Served":
        replica = start_replica(model_dir, flags, threads, repo=repo)
        core = httpx.get(f"{replica.url}/health", timeout=10).json()["engine_core"]["pid"]
        return cls(replica, (replica.process.pid, int(core)))

    def cpu_s(self) -> float:
        """CPU seconds the server and its core have used (user and system)."""
        total = 0
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])    # utime, stime
        return total / os.sysconf("SC_CLK_TCK")


async def closed_loop(served: Served, workload: Workload, concurrency: int
                      ) -> tuple[list[RequestResult], float, float]:
    """Every request of the workload, at most `concurrency` in flight at once; the results,
    the wall seconds and the replica's CPU seconds they took."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=served.replica.url, timeout=300, limits=limits) as client:
        await one_request(client, None, workload.prompts[0], 4)   # warm-up, untimed

        async def gated(prompt: list[int], max_tokens: int) -> RequestResult:
            async with gate:
                return await one_request(client, None, prompt, max_tokens)

        start, cpu_start = time.perf_counter(), served.cpu_s()
        results = await asyncio.gather(*(gated(p, n) for p, n in
                                         zip(workload.prompts, workload.output_lens)))
        return list(results), time.perf_counter() - start, served.cpu_s() - cpu_start


def one_round(served: Served, workload: Workload, args: argparse.Namespace) -> dict[str, float]:
    results, duration, cpu_s = asyncio.run(closed_loop(served, workload, args.concurrency))
    single = Workload(workload.prompts[:args.ttft_requests], [args.ttft_output_len] * args.ttft_requests)
    singles, _, _ = asyncio.run(closed_loop(served, single, 1))
    failed = [r.error for r in results + singles if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} request(s) failed, first: {failed[0]}")
    tokens = sum(r.output_tokens for r in results)
    return {"tok_s": tokens / duration, "tok_cpu_s": tokens / cpu_s,
            "ttft_p50_ms": 1000 * statistics.median(r.ttft_s for r in singles)}


def describe(checkout: Path) -> str:
    """The commit a checkout is at (and whether its tree differs), and where its code is
    imported from when run as the benchmark runs its server."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *argv], capture_output=True, text=True,
                              check=True).stdout.strip()

    commit = git("rev-parse", "HEAD")
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    origin = subprocess.run([sys.executable, "-c", "import runtime.serve.server as s; print(s.__file__)"],
                            cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                            capture_output=True, text=True, check=True).stdout.strip()
    return f"{commit} ({git('log', '-1', '--format=%s')}){dirty}; code: {origin}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="the checkout measured as before")
    p.add_argument("--after", type=Path, default=REPO, help="the checkout measured as after (this one)")
    p.add_argument("--rounds", type=int, default=21, help="each measures both servers, in turn")
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--input-len", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[32, 96], metavar=("MIN", "MAX"))
    p.add_argument("--concurrency", type=int, default=32, help="clients (and max_num_seqs)")
    p.add_argument("--ttft-requests", type=int, default=16, help="sent one at a time")
    p.add_argument("--ttft-output-len", type=int, default=4)
    p.add_argument("--kv-cache-tokens", type=int, default=32768)
    p.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    workload = Workload.random(args.num_prompts, tuple(args.input_len), tuple(args.output_len),
                               SMALL_SPEC["vocab_size"], args.seed)
    for side in SIDES:
        print(f"{side + ':':<8}{describe(checkouts[side])}")
    print(f"workload: {args.num_prompts} requests, prompts {args.input_len}, outputs "
          f"{args.output_len} ({sum(workload.output_lens)} tokens), concurrency "
          f"{args.concurrency}; TTFT: {args.ttft_requests} requests one at a time, "
          f"{args.ttft_output_len} tokens each; {args.threads} torch thread(s) per engine")
    print(f"model: {SMALL_SPEC}")
    report(measure(checkouts, workload, args))


def measure(checkouts: dict[str, Path], workload: Workload, args: argparse.Namespace
            ) -> dict[str, list[dict[str, float]]]:
    from tests.support.model_factory import make_model

    rows: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    flags = ["--kv-cache-tokens", str(args.kv_cache_tokens), "--max-num-seqs", str(args.concurrency)]
    with tempfile.TemporaryDirectory(prefix="engine-hop-bench-") as tmp:
        model_dir = make_model(Path(tmp) / "small", **SMALL_SPEC)
        servers: dict[str, Served] = {}
        try:
            for side in SIDES:
                servers[side] = Served.start(model_dir, flags, args.threads, checkouts[side])
            for n in range(args.rounds):
                for side in (SIDES if n % 2 == 0 else SIDES[::-1]):
                    rows[side].append(one_round(servers[side], workload, args))
                print(f"round {n + 1}: " + "  ".join(f"{side} {fmt(rows[side][-1])}" for side in SIDES),
                      flush=True)
        finally:
            for served in servers.values():
                served.replica.stop()
    return rows


def fmt(row: dict[str, float]) -> str:
    return " ".join(f"{key}={value:.2f}" for key, value in row.items())


COLUMNS = (("tok_s", "tok/s c=32"), ("tok_cpu_s", "tok/CPU-s c=32"), ("ttft_p50_ms", "TTFT p50 c=1 ms"))


def report(rows: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{'median over rounds':<20}" + "".join(f"{title:>18}" for _, title in COLUMNS))
    for side in SIDES:
        print(f"{side:<20}" + "".join(f"{statistics.median(r[key] for r in rows[side]):>18.2f}"
                                      for key, _ in COLUMNS))
    pairs = list(zip(rows["before"], rows["after"]))
    print(f"{'after / before':<20}" + "".join(
        f"{statistics.median(a[key] / b[key] for b, a in pairs):>17.3f}x" for key, _ in COLUMNS))
    print("(after / before: the median of the rounds' ratios; throughput higher is better, "
          "TTFT lower; tok/CPU-s counts the server's and its engine core's CPU time, which "
          "other load on the machine moves less than wall time)")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
