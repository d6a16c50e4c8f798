"""The calibration run: poolsim.calibrate.Timings measured through a real `thawpool up`.

Three deployments of one tenant, each on its own copy of the model in S3 (so that each
first start downloads), and every request a streamed completion timed by the client
(benchmarks/trace_replay.complete):

  s3       each deployment's first request: the download, then a standby's load
  warm     a ready replica's TTFT at batch 1 over prompt lengths, one request at a time,
           each after a pause and answered in full (ANSWER_TOKENS): trace requests come
           after gaps and are answered at length, and both cost the first token a few
           ms against back-to-back calls of 2 tokens; the lengths taken in turn so that
           a drift of the machine's load spreads evenly
  bursts   k requests sent at once, BURST_PROMPT tokens each: their last first token
  decode   b requests at once of DECODE_TOKENS tokens each: (total - TTFT) / (tokens - 1)
  standby  a request to a deployment scaled to zero, its weights cached, a standby ready
  cache    a request straight after another deployment's start took the standby: a fresh
           process loads the weights

Before each cold request every calibration deployment has scaled to zero (the caller
deploys them with an idle timeout of IDLE_S) and the node's standby is up: a runtime process that serves no replica
has used no CPU for a moment (standby.py).
"""
from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import httpx

from benchmarks.pool_run import Deploy, open_replicas
from benchmarks.standby import standby_ready
from benchmarks.trace_replay import Answer, client, complete, prompt_ids
from poolsim.calibrate import Timings
from tests.faults.stack import MODELS_BUCKET, FaultStack

TENANT = "calibration"
IDLE_S = 4.0
COLD_PROMPT = 32
WARM_PROMPTS = (8, 64, 128, 256, 512)
WARM_REPEATS = 7
PAUSE_S = 0.3
ANSWER_TOKENS = 32
BURSTS = (1, 2, 4, 8, 16)
BURST_PROMPT = 8
BATCHES = (1, 2, 4, 8, 16)
DECODE_TOKENS = 48
ROUNDS = 3                           # of each cold start


class Probe:
    """The calibration tenant's deployments on a running stack, and the requests it times."""

    def __init__(self, stack: FaultStack, uris: Sequence[str], vocab: int, deploy: Deploy):
        self.stack, self.vocab, self.rng = stack, vocab, random.Random(1)
        self.key = stack.tenant_key(TENANT)
        self.names = [f"calib-{i}" for i in range(len(uris))]
        for name, uri in zip(self.names, uris):
            deploy(self.key, name, uri)

    async def ask(self, http: httpx.AsyncClient, name: str, prompt: int, tokens: int) -> Answer:
        answer = await complete(http, self.key, name, prompt_ids(self.rng, prompt, self.vocab), tokens)
        if not answer.ok:
            raise RuntimeError(f"calibration request to {name} failed: {answer.status} {answer.error}")
        return answer

    async def cold(self, http: httpx.AsyncClient, name: str) -> float:
        """One cold request, once everything has scaled to zero and a standby is up."""
        await until(lambda: self.all_stopped(), "calibration replicas scaled to zero")
        await until(lambda: asyncio.to_thread(standby_ready, self.stack), "a standby ready")
        return ttft(await self.ask(http, name, COLD_PROMPT, ANSWER_TOKENS))

    async def all_stopped(self) -> bool:
        return not await open_replicas(self.stack, [TENANT])


def ttft(answer: Answer) -> float:
    assert answer.ttft_s is not None
    return answer.ttft_s


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(0.25)


async def warm_ttfts(probe: Probe, http: httpx.AsyncClient, name: str) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {p: [] for p in WARM_PROMPTS}
    for _ in range(WARM_REPEATS):
        for p in WARM_PROMPTS:
            await asyncio.sleep(PAUSE_S)
            found[p].append(ttft(await probe.ask(http, name, p, ANSWER_TOKENS)))
    return found


async def bursts(probe: Probe, http: httpx.AsyncClient, name: str) -> dict[int, list[float]]:
    await asyncio.gather(*[probe.ask(http, name, BURST_PROMPT, 2) for _ in range(max(BURSTS))])  # connections
    found: dict[int, list[float]] = {k: [] for k in BURSTS}
    for _ in range(ROUNDS + 2):
        for k in BURSTS:
            await asyncio.sleep(PAUSE_S)
            answers = await asyncio.gather(*[probe.ask(http, name, BURST_PROMPT, ANSWER_TOKENS) for _ in range(k)])
            found[k].append(max(ttft(a) for a in answers))
    return found


async def steps(probe: Probe, http: httpx.AsyncClient, name: str) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {b: [] for b in BATCHES}
    for _ in range(ROUNDS):
        for b in BATCHES:
            answers = await asyncio.gather(*[probe.ask(http, name, 16, DECODE_TOKENS) for _ in range(b)])
            found[b].append(statistics.median((a.total_s - ttft(a)) / (a.tokens - 1) for a in answers))
    return found


async def measure(stack: FaultStack, uris: Sequence[str], model: Path, vocab: int, parameters: float,
                  deploy: Deploy, refill_delay_s: float) -> Timings:
    """`deploy` creates the calibration deployments: scaled to zero after IDLE_S."""
    probe = Probe(stack, uris, vocab, deploy)
    first, second, third = probe.names
    cold: dict[str, list[float]] = {"s3": [], "standby": [], "cache": []}
    async with client(stack.base_url) as http:
        for name in probe.names:
            cold["s3"].append(await probe.cold(http, name))
        await probe.ask(http, first, 8, 2)           # its start: the warm requests find it up
        warm = await warm_ttfts(probe, http, first)
        burst = await bursts(probe, http, first)
        step = await steps(probe, http, first)
        for _ in range(ROUNDS):
            cold["standby"].append(await probe.cold(http, second))
            cold["cache"].append(ttft(await probe.ask(http, third, COLD_PROMPT, ANSWER_TOKENS)))
    weights = sorted(model.glob("*.safetensors"))
    return Timings(weight_bytes=sum(p.stat().st_size for p in weights), parameters=parameters,
                   step_s=step, warm_ttft_s=warm, burst_last_ttft_s=burst, burst_prompt_tokens=BURST_PROMPT,
                   cold_ttft_s=cold, cold_prompt_tokens=COLD_PROMPT,
                   s3_gbps=s3_gbps(stack, uris[0], weights), read_gbps=read_gbps(weights),
                   refill_delay_s=refill_delay_s)


def s3_gbps(stack: FaultStack, uri: str, weights: Sequence[Path]) -> float:
    """A GET of the weights from the stack's S3, bytes over seconds (the median of 3)."""
    s3, prefix = stack.s3.client(), uri.removeprefix(f"s3://{MODELS_BUCKET}/")
    rates = []
    for _ in range(3):
        start, size = time.perf_counter(), 0
        for path in weights:
            size += len(s3.get_object(Bucket=MODELS_BUCKET, Key=prefix + path.name)["Body"].read())
        rates.append(size / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def read_gbps(weights: Sequence[Path]) -> float:
    """A read() of the weight files from the page cache (the median of 3, after one to warm it)."""
    rates = []
    for _ in range(4):
        start, size = time.perf_counter(), 0
        for path in weights:
            size += len(path.read_bytes())
        rates.append(size / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates[1:])


def summary(t: Timings) -> dict[str, str]:
    """The medians a kind was fitted to, for the report."""
    def ms(samples: Mapping[Any, Sequence[float]]) -> str:
        return ", ".join(f"{k}: {statistics.median(v) * 1000:.1f}" for k, v in samples.items())
    return {"decode step by batch (ms)": ms(t.step_s), "warm TTFT by prompt tokens (ms)": ms(t.warm_ttft_s),
            f"a burst's last TTFT by burst size, prompt {t.burst_prompt_tokens} (ms)": ms(t.burst_last_ttft_s),
            f"cold TTFT by tier, prompt {t.cold_prompt_tokens} (ms)": ms(t.cold_ttft_s),
            "every cold TTFT (ms)": "; ".join(f"{k}: {[round(x * 1000) for x in v]}" for k, v in t.cold_ttft_s.items()),
            "bulk rates": f"S3 GET {t.s3_gbps:.3f} GB/s, page-cache read {t.read_gbps:.2f} GB/s"}
