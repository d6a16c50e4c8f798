"""A poolsim trace replayed against a real gateway: each request sent at its time, as a
streamed /v1/completions of exactly its lengths, timed by the client.

A request's prompt is `prompt_tokens` random token ids (no two prompts share a prefix,
so the prefix cache never shortens one) and it asks for `max_tokens = output_tokens`
with `ignore_eos`, so the answer is exactly as long as the trace says. Its time to first
token runs from the moment it is sent to the first chunk whose cumulative usage counts
a completion token (`continuous_usage_stats`), as benchmarks/serve.py counts tokens.
The deployment is the request's `model`; each deployment's tenant key authorizes it.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import httpx

from poolsim.workload import Request

FIRST_TOKEN_ID = 5                   # ids below are the factory tokenizer's specials


@dataclass
class Answer:
    status: int = 0                  # HTTP status; 0: no answer (a connection error)
    sent_s: float = 0.0              # time.perf_counter() when sent
    ttft_s: Optional[float] = None
    total_s: float = 0.0
    tokens: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft_s is not None


@dataclass
class Sent:
    request: Request
    late_s: float                    # how far after its time the client sent it
    answer: Answer


def prompt_ids(rng: random.Random, tokens: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(tokens)]


async def complete(client: httpx.AsyncClient, key: str, model: str, prompt: list[int],
                   max_tokens: int) -> Answer:
    """One streamed completion, timed from here to its first and last token."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    answer = Answer(sent_s=time.perf_counter())
    try:
        async with client.stream("POST", "/v1/completions", json=body,
                                 headers={"authorization": f"Bearer {key}"}) as resp:
            answer.status = resp.status_code
            if resp.status_code != 200:
                answer.error = (await resp.aread()).decode(errors="replace")[:200]
            else:
                await _read_tokens(resp, answer)
    except httpx.HTTPError as exc:
        answer.error = repr(exc)
    answer.total_s = time.perf_counter() - answer.sent_s
    return answer


async def _read_tokens(resp: httpx.Response, answer: Answer) -> None:
    async for line in resp.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        tokens = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", 0)
        if tokens > answer.tokens:
            if answer.ttft_s is None:
                answer.ttft_s = time.perf_counter() - answer.sent_s
            answer.tokens = tokens


def client(base_url: str, timeout_s: float = 120.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits)


async def replay(base_url: str, keys: Mapping[str, str], requests: Iterable[Request], vocab: int,
                 seed: int = 0) -> list[Sent]:
    """Every request sent at its `at_s` from now; returns once all have been answered."""
    rng = random.Random(seed)
    async with client(base_url) as http:
        start = time.perf_counter()
        tasks = []
        for req in requests:
            await asyncio.sleep(max(0.0, start + req.at_s - time.perf_counter()))
            late = time.perf_counter() - start - req.at_s
            prompt = prompt_ids(rng, req.prompt_tokens, vocab)
            tasks.append(asyncio.create_task(_sent(http, keys[req.deployment], req, prompt, late)))
        return list(await asyncio.gather(*tasks))


async def _sent(http: httpx.AsyncClient, key: str, req: Request, prompt: list[int], late: float) -> Sent:
    return Sent(req, late, await complete(http, key, req.deployment, prompt, req.output_tokens))
