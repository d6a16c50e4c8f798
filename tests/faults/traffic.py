"""Traffic through the control plane with the official `openai` client, and what every
client received.

Each call streams with `continuous_usage_stats`, so every chunk a client reads carries
the cumulative usage of the tokens sent so far: the last usage a client read is what
it received, however the stream ended (finished, an error event, a cut connection).
The client never retries (a retry would be a second call), and each call has its own
request id, so rows and calls pair one to one.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

import httpx
import openai

PROMPT = [{"role": "user", "content": "Tell me about serverless GPU pools."}]


@dataclass
class Call:
    """One call as its client saw it."""
    request_id: str
    tenant: str
    started: float                    # time.monotonic()
    latency_s: float = 0.0
    status: int = 200                 # HTTP status; 0: the connection failed
    prompt_tokens: int = 0            # received, from the last usage the client read
    completion_tokens: int = 0
    # the completion tokens of the usage read before the last change: what a bill one
    # chunk behind holds (B-CP-3: a kill between a chunk's send and its journal frame)
    previous_completion_tokens: int = 0
    finished: bool = False            # read a finish_reason: the whole answer
    retry_after: Optional[str] = None
    error: Optional[str] = None


@dataclass
class Ledger:
    """Every call made, to hold the bill against."""
    calls: list[Call] = field(default_factory=list)

    def received(self, tenant: str) -> tuple[int, int]:
        mine = [c for c in self.calls if c.tenant == tenant]
        return sum(c.prompt_tokens for c in mine), sum(c.completion_tokens for c in mine)

    def by_status(self, tenant: Optional[str] = None) -> dict[int, int]:
        counts: dict[int, int] = {}
        for call in self.calls:
            if tenant is None or call.tenant == tenant:
                counts[call.status] = counts.get(call.status, 0) + 1
        return counts


def client(base_url: str, key: str, timeout_s: float = 120.0) -> openai.AsyncOpenAI:
    # every connection may stay alive: with the openai client's default of 100 kept alive,
    # a burst of 104 new streams left some calls never answered under httpcore (the
    # gateway served them; the client read nothing until its timeout)
    http = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(
        max_connections=1000, max_keepalive_connections=1000))
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0,
                              timeout=timeout_s, http_client=http)


async def stream_chat(api: openai.AsyncOpenAI, ledger: Ledger, tenant: str, model: str,
                      max_tokens: int, on_chunk=None) -> Call:
    """One streamed chat completion; `on_chunk(call)` runs after each chunk read."""
    call = Call(f"{tenant}-{uuid.uuid4().hex[:12]}", tenant, time.monotonic())
    ledger.calls.append(call)
    try:
        stream = await api.chat.completions.create(
            model=model, messages=PROMPT, max_tokens=max_tokens, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_headers={"x-request-id": call.request_id},
            extra_body={"ignore_eos": True, "temperature": 0})
        async for chunk in stream:
            _observe(call, chunk)
            if on_chunk is not None:
                await on_chunk(call)
    except openai.APIStatusError as exc:
        call.status, call.error = exc.status_code, str(exc)[:200]
        call.retry_after = exc.response.headers.get("retry-after")
    except openai.APIError as exc:       # an error event mid-stream, or the connection cut
        call.status = 0 if isinstance(exc, openai.APIConnectionError) else 502
        call.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    call.latency_s = time.monotonic() - call.started
    return call


def _observe(call: Call, chunk) -> None:
    if chunk.usage is not None:
        call.prompt_tokens = chunk.usage.prompt_tokens
        if chunk.usage.completion_tokens != call.completion_tokens:
            call.previous_completion_tokens = call.completion_tokens
        call.completion_tokens = chunk.usage.completion_tokens
    if chunk.choices and chunk.choices[0].finish_reason is not None:
        call.finished = True


async def steady(api: openai.AsyncOpenAI, ledger: Ledger, tenant: str, model: str,
                 max_tokens: int, streams: int, until: asyncio.Event) -> None:
    """`streams` clients, each calling again as soon as its call ends, until `until` is set."""
    async def one_client() -> None:
        while not until.is_set():
            call = await stream_chat(api, ledger, tenant, model, max_tokens)
            if call.status not in (200, 502):
                await asyncio.sleep(0.2)          # refused: do not spin
    await asyncio.gather(*(one_client() for _ in range(streams)))
