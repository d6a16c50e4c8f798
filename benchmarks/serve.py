"""Online serving benchmark in the style of `vllm bench serve`.

Replays Poisson arrivals of streaming /v1/completions requests against a
replica over HTTP (httpx) and prints TTFT, TPOT, inter-token latency and
end-to-end latency (mean, p50, p99). Bounded by a request count and a wall
time. Without --url it builds a random-weight Llama with
tests.support.model_factory, starts `python -m runtime.serve.server` on it, and, as
the peer measured in the same run, pushes the same requests through the
offline `runtime.LLM` (all at once) to print the serving path's throughput
as a ratio of the bare engine's. The served throughput is bounded by
--request-rate (Poisson arrivals), the peer's is not, so that ratio compares
engines only at --request-rate inf. Random weights, CPU, --threads torch threads.
The report, with the machine's details, is also written to benchmarks/results/serve.txt.

    .venv/bin/python -m benchmarks.serve --num-prompts 64 --request-rate 8
    .venv/bin/python -m benchmarks.serve --url http://127.0.0.1:8000 --model NAME
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]        # token ids, so every request has an exact length
    output_lens: list[int]

    @classmethod
    def random(cls, count: int, input_len: tuple[int, int], output_len: tuple[int, int],
               vocab: int, seed: int) -> "Workload":
        rng = random.Random(seed)
        prompts = [[rng.randrange(5, vocab) for _ in range(rng.randint(*input_len))]
                   for _ in range(count)]
        return cls(prompts, [rng.randint(*output_len) for _ in range(count)])


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot_s(self) -> Optional[float]:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


# ---------------------------------------------------------------- client side

async def one_request(client: httpx.AsyncClient, model: Optional[str], prompt: list[int],
                      max_tokens: int) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True,
                                               "continuous_usage_stats": True}}
    if model:
        body["model"] = model
    start = time.perf_counter()
    result, last_token_at, tokens = RequestResult(ok=False), None, 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return RequestResult(ok=False, error=f"{resp.status_code} {await resp.aread()!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                usage = json.loads(line[6:]).get("usage") or {}
                now = time.perf_counter()
                # Count tokens, not text: a chunk may carry several or hold back bytes.
                if usage.get("completion_tokens", 0) > tokens:
                    if last_token_at is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last_token_at)
                    last_token_at, tokens = now, usage["completion_tokens"]
                result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
    except httpx.HTTPError as exc:
        return RequestResult(ok=False, error=repr(exc))
    result.ok, result.output_tokens, result.e2e_s = True, tokens, time.perf_counter() - start
    return result


async def run_workload(url: str, model: Optional[str], workload: Workload, rate: float,
                       max_duration_s: float, seed: int) -> tuple[list[RequestResult], float]:
    """Issue requests with exponential gaps (Poisson arrivals) until the count or time runs out."""
    rng = random.Random(seed + 1)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        await one_request(client, model, workload.prompts[0], 4)   # warm-up, untimed
        start = time.perf_counter()
        tasks = []
        for prompt, out_len in zip(workload.prompts, workload.output_lens):
            if time.perf_counter() - start > max_duration_s:
                break
            tasks.append(asyncio.create_task(one_request(client, model, prompt, out_len)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        left = max(0.0, max_duration_s - (time.perf_counter() - start))
        done, pending = await asyncio.wait(tasks, timeout=left) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        results = [t.result() for t in tasks if t in done]
        results += [RequestResult(ok=False, error="cut off at --max-duration")] * len(pending)
        return results, time.perf_counter() - start


# ---------------------------------------------------------------- report

def _ms(values: list[float], q: Optional[float] = None) -> float:
    if not values:
        return float("nan")
    if q is None:
        return 1000 * statistics.fmean(values)
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def report(results: list[RequestResult], duration_s: float) -> dict[str, float]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    line = "{:<40}{:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40}{:<10}".format("Successful requests:", len(ok)))
    print("{:<40}{:<10}".format("Failed requests:", len(results) - len(ok)))
    print(line("Benchmark duration (s):", duration_s))
    print("{:<40}{:<10}".format("Total input tokens:", sum(r.prompt_tokens for r in ok)))
    print("{:<40}{:<10}".format("Total generated tokens:", out_tokens))
    print(line("Request throughput (req/s):", len(ok) / duration_s))
    print(line("Output token throughput (tok/s):", out_tokens / duration_s))
    series = {
        ("TTFT", "Time to First Token"): [r.ttft_s for r in ok],
        ("TPOT", "Time per Output Token (excl. 1st token)"): [r.tpot_s for r in ok if r.tpot_s],
        ("ITL", "Inter-token Latency"): [g for r in ok for g in r.itl_s],
        ("E2EL", "End-to-end Latency"): [r.e2e_s for r in ok],
    }
    for (short, title), values in series.items():
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print(line(f"Mean {short} (ms):", _ms(values)))
        print(line(f"Median {short} (ms):", _ms(values, 0.5)))
        print(line(f"P99 {short} (ms):", _ms(values, 0.99)))
    print("=" * 50)
    for r in results:
        if not r.ok:
            print(f"failed: {r.error}", file=sys.stderr)
            break
    return {"output_tok_s": out_tokens / duration_s}


# ---------------------------------------------------------------- self-hosted replica

@dataclass
class Replica:
    process: subprocess.Popen
    url: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_replica(model_dir: Path, engine_args: list[str], threads: int, repo: Path = REPO) -> Replica:
    """`python -m runtime.serve.server` of the checkout at `repo` (this one by default)."""
    from controlplane.embedded.ports import free_port

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(repo)}
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime.serve.server", "--model", str(model_dir), "--host", "127.0.0.1",
         "--port", str(port), *engine_args], cwd=repo, env=env)
    return wait_ready(Replica(process, f"http://127.0.0.1:{port}"), "replica")


def wait_ready(replica: Replica, what: str, timeout_s: float = 300) -> Replica:
    """Until GET /health answers 200 (llama-server's too); stopped, and exit, if it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and replica.process.poll() is None:
        try:
            if httpx.get(f"{replica.url}/health", timeout=2).status_code == 200:
                return replica
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    replica.stop()
    raise SystemExit(f"{what} did not become ready (exit code {replica.process.poll()})")


def build_model(root: Path, size: str) -> Path:
    from tests.support.model_factory import ModelSpec, make_model

    specs = {
        "tiny": ModelSpec(),
        "small": ModelSpec(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=4, vocab_size=1024,
                           max_position_embeddings=2048),
        "medium": ModelSpec(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                            num_attention_heads=8, num_key_value_heads=4, vocab_size=4096,
                            max_position_embeddings=2048),
    }
    return make_model(root / size, specs[size])


def offline_tok_s(model_dir: Path, workload: Workload, engine_kwargs: dict, threads: int) -> float:
    """The peer: the same requests through runtime.LLM in this process, all submitted at once."""
    import torch

    torch.set_num_threads(threads)
    from runtime import LLM, SamplingParams

    llm = LLM(str(model_dir), **engine_kwargs)
    llm.generate([workload.prompts[0]], SamplingParams(max_tokens=4))   # warm-up, untimed
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
              for n in workload.output_lens]
    start = time.perf_counter()
    outs = llm.generate(workload.prompts, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


# ---------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="an already running replica; default: start one")
    p.add_argument("--model", help="served model name to send (with --url)")
    p.add_argument("--model-size", choices=["tiny", "small", "medium"], default="small")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=8.0, help="requests/s; inf: all at once")
    p.add_argument("--max-duration", type=float, default=300.0, help="seconds, then stop")
    p.add_argument("--input-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    p.add_argument("--kv-cache-tokens", type=int, default=32768)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the replica and the peer (2+ thrash on a busy machine)")
    p.add_argument("--no-peer", action="store_true", help="skip the offline-engine peer run")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    engine_kwargs = {"kv_cache_tokens": args.kv_cache_tokens}
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        model_dir, replica = None, None
        if args.url is None:
            model_dir = build_model(Path(tmp), args.model_size)
            replica = start_replica(model_dir, ["--kv-cache-tokens", str(args.kv_cache_tokens)],
                                    args.threads)
        vocab = 400 if args.url else min(400, json.loads((model_dir / "config.json").read_text())["vocab_size"])
        workload = Workload.random(args.num_prompts, tuple(args.input_len), tuple(args.output_len),
                                   vocab, args.seed)
        try:
            results, duration = asyncio.run(run_workload(
                args.url or replica.url, args.model, workload, args.request_rate,
                args.max_duration, args.seed))
        finally:
            if replica is not None:
                replica.stop()
        served = report(results, duration)
        if model_dir is not None and not args.no_peer:
            peer = offline_tok_s(model_dir, workload, engine_kwargs, args.threads)
            print("{:<40}{:<10.2f}".format("Offline LLM.generate (tok/s):", peer))
            print("{:<40}{:<10.2f}".format("Served / offline throughput:",
                                           served["output_tok_s"] / peer))
            print("(the served figure is bounded by --request-rate; use inf to compare engines)")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
