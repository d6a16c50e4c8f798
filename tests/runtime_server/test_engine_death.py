"""An engine that dies mid-stream: the replica says so in the stream and never sends
[DONE], so nobody downstream (the gateway, a client) takes the answer for complete.
The engine's step loop runs in a thread over the engine core's pipe messages
(tests/runtime_server/core_thread.py)."""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.serve.engine_core import EngineInfo
from runtime.serve.metrics import ServerMetrics
from runtime.serve.completions import OpenAIServing
from runtime.engine.outputs import EngineStats, RequestOutput
from runtime.core.tokenizer import Tokenizer
from wire.requests import parse_request
from wire.sse import data_of
from tests.runtime_server.core_thread import threaded_client

pytestmark = pytest.mark.asyncio(loop_scope="session")


class DyingEngine:
    """runtime.serve.engine_core.Engine that gives every request one token a step, and whose
    third step fails (as a CUDA fault or a dead tensor-parallel rank would)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.steps = 0

    def add_request(self, request_id, prompt_token_ids, params, cache_salt=None, lora=None,
                    priority=0) -> None:
        self.requests[request_id] = len(prompt_token_ids)

    def abort_request(self, request_id) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def unfinished_request_ids(self) -> list[str]:
        return list(self.requests)

    def stats(self) -> EngineStats:
        return EngineStats()

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("an illegal memory access was encountered")
        return [RequestOutput(rid, [65], num_prompt_tokens=n) for rid, n in self.requests.items()]


async def test_engine_death_mid_stream_is_an_error_event_without_done(tiny_model):
    request = parse_request("completions", {"prompt": "hi", "max_tokens": 50, "stream": True,
                                            "stream_options": {"include_usage": True,
                                                               "continuous_usage_stats": True}})
    sent: list[dict] = []

    async def receive():        # the client stays
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    async with threaded_client(DyingEngine(), EngineInfo(512, "generate", {})) as engine:
        serving = OpenAIServing("m", engine, Tokenizer(tiny_model), 512, ServerMetrics(lambda: None))
        response = await serving.create(request, "req-dies", receive)
        await response({"type": "http"}, receive, send)
        assert "illegal memory access" in str(engine.error)
    lines = b"".join(m.get("body", b"") for m in sent).decode().split("\n\n")
    events = [line.removeprefix("data: ") for line in lines if line]
    assert events[-1] != "[DONE]" and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert "illegal memory access" in error["message"]
    chunks = [data_of(f"data: {e}") for e in events[:-1]]
    assert chunks and chunks[-1]["usage"]["completion_tokens"] == 2, \
        "the tokens delivered before the death, as cumulative usage"
