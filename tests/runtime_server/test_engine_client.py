"""EngineClient and the engine core's step loop over a real LLMEngine, the loop run in a
thread of this process (tests/runtime_server/core_thread.py) over the same pipe messages
as the engine-core process: adds, aborts, id dedupe, refusals, cancel, back-pressure."""
from __future__ import annotations

import asyncio

import pytest

from runtime import SamplingParams
from runtime.serve import engine_client
from runtime.serve.engine_client import EngineClient
from runtime.serve.engine_core import EngineInfo
from tests.runtime_server.core_thread import threaded_client
from tests.support.waiting import eventually

# The async fixture lives on the session loop (pyproject), so the tests must too.
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
async def engine(offline_llm):
    # The offline LLM's engine is idle between its generate() calls; borrow it.
    async with threaded_client(offline_llm.engine, EngineInfo.of(offline_llm.engine, {})) as client:
        yield client


async def collect(engine: EngineClient, request_id: str, ids: list[int], params) -> list[int]:
    tokens = []
    async with await engine.add(request_id, ids, params) as stream:
        async for out in stream:
            tokens += out.new_token_ids
    return tokens


async def wait_blocks_free(engine: EngineClient) -> None:
    await eventually(lambda: engine.stats.kv_blocks_used == 0 and engine.stats.num_running == 0,
                     timeout_s=30, what=f"the core freeing every block ({engine.stats})")


async def test_concurrent_requests_match_offline(engine, offline_llm):
    prompts = [offline_llm.tokenizer.encode(p) for p in
               ["Hello, world!", "def add(a, b):", "Paged attention stores keys and values"]]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    got = await asyncio.gather(*[collect(engine, f"r{i}", p, params) for i, p in enumerate(prompts)])
    assert engine.num_in_flight == 0
    await engine.stop()   # hand the engine back before using it offline
    want = [o.token_ids for o in offline_llm.generate(prompts, params)]
    assert got == want


async def test_leaving_early_aborts_and_frees_blocks(engine):
    params = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)
    async with await engine.add("long", [5, 6, 7], params) as stream:
        async for out in stream:
            assert not out.finished
            break
    await wait_blocks_free(engine)
    assert engine.num_in_flight == 0


async def test_repeated_ids_get_suffixes_until_freed(engine):
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    first = await engine.add("same", [5, 6], params)
    second = await engine.add("same", [5, 6], params)
    assert (first.request_id, second.request_id) == ("same", "same-1")
    first.close()
    second.close()
    await wait_blocks_free(engine)
    # once the engine let go of them, the plain id is free again
    third = await engine.add("same", [5, 6], params)
    assert third.request_id == "same"
    third.close()
    await wait_blocks_free(engine)


async def test_engine_refusal_raises_and_reserves_nothing(engine):
    params = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match="^prompt"):
        await engine.add("big", [5] * 5000, params)
    ok = await engine.add("big", [5], params)
    assert ok.request_id == "big"
    assert [o async for o in ok][-1].finish_reason == "length"


async def test_cancel_waits_for_the_engines_last_output(engine):
    params = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)
    stream = await engine.add("to-cancel", [5, 6, 7], params)
    async for _ in stream:
        break
    last = await stream.cancel()
    assert last.finished and last.finish_reason == "abort" and last.metrics is not None
    await wait_blocks_free(engine)


async def test_a_reader_that_falls_behind_pauses_the_pipe(offline_llm, monkeypatch):
    """The server buffers at most MAX_UNDELIVERED outputs (plus the batch that crossed it);
    the rest waits in the pipe, and all of it arrives in order once the reader reads."""
    monkeypatch.setattr(engine_client, "MAX_UNDELIVERED", 8)
    llm_engine = offline_llm.engine
    async with threaded_client(llm_engine, EngineInfo.of(llm_engine, {})) as client:
        # few enough tokens that every step's batch fits in the pipe: the core finishes
        params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
        async with await client.add("behind", [5, 6, 7, 8], params) as stream:
            await eventually(lambda: stream.backlog >= 9 and not llm_engine.has_unfinished_requests(),
                             timeout_s=30, what="the core making every token while nobody reads")
            assert stream.backlog <= 9
            tokens = [t async for out in stream for t in out.new_token_ids]
        assert len(tokens) == 60 and stream.finished
