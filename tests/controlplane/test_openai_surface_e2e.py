"""Issue 17 through the control plane and the real pool, with the official openai client:
n > 1 and a batch of prompts billed with each prompt once, /v1/models listing only the
caller's deployments, and /v1/embeddings from a deployment of engine task "embed",
equal to the offline engine's vectors and billed per input token."""
from __future__ import annotations

from decimal import Decimal

import openai
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import UsageEvent
from tests.controlplane.conftest import pooled_control_plane

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
INPUT, OUTPUT = Decimal("1000"), Decimal("3000")      # per million tokens
MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    # two slots: the generating and the embedding deployment each hold a replica
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-surface"),
                                    cpu_slots=2) as plane:
        yield plane


async def _deploy(client, name: str, model_uri: str, **engine) -> None:
    created = await client.post("/v1/deployments", json={
        "name": name, "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 512, **engine}})
    assert created.status_code == 201, created.text


async def _row(plane, request_id: str) -> UsageEvent:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return await session.scalar(select(UsageEvent).where(UsageEvent.request_id == request_id))


def _cost(prompt: int, completion: int) -> Decimal:
    return (prompt * INPUT + completion * OUTPUT) / 1_000_000


async def test_samples_batches_models_and_embeddings_are_served_and_billed(
        plane, model_uri, tiny_model):
    key, other = await plane.tenant_key("surface"), await plane.tenant_key("elsewhere")
    await plane.set_price(tenant="surface", input_per_mtok=str(INPUT), output_per_mtok=str(OUTPUT),
                          cached_input_per_mtok=str(INPUT))
    client = plane.client(key)
    await _deploy(client, "gen", model_uri)
    await _deploy(client, "emb", model_uri, task="embed", pooling="mean")
    await _deploy(plane.client(other), "theirs", model_uri)
    oa = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0,
                            timeout=280)
    try:
        assert sorted(m.id for m in (await oa.models.list()).data) == ["emb", "gen"]

        one = await oa.chat.completions.create(model="gen", messages=MESSAGES, max_tokens=4,
                                               extra_body={"ignore_eos": True})
        stream = await oa.chat.completions.create(
            model="gen", messages=MESSAGES, max_tokens=4, n=3, temperature=1.0, seed=2,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": "surface-n3"})
        texts, usage = {}, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        assert sorted(texts) == [0, 1, 2]
        assert (usage.prompt_tokens, usage.completion_tokens) == (one.usage.prompt_tokens, 12)
        row = await _row(plane, "surface-n3")
        assert (row.prompt_tokens, row.completion_tokens) == (usage.prompt_tokens, 12)
        assert row.cost == _cost(row.prompt_tokens, 12)

        batch = await oa.completions.create(model="gen", prompt=["a b c", [5, 6, 7, 8]], n=2,
                                            max_tokens=3, extra_body={"ignore_eos": True},
                                            extra_headers={"x-request-id": "surface-batch"})
        assert [c.index for c in batch.choices] == [0, 1, 2, 3]
        assert batch.usage.completion_tokens == 12
        row = await _row(plane, "surface-batch")
        assert row.prompt_tokens == batch.usage.prompt_tokens > 4

        inputs = ["The quick brown fox", "Paged attention stores keys"]
        got = await oa.embeddings.create(model="emb", input=inputs,
                                         extra_headers={"x-request-id": "surface-emb"})
        with pytest.raises(openai.BadRequestError):   # the embedding model does not generate
            await oa.completions.create(model="emb", prompt="x", max_tokens=2)
    finally:
        await oa.close()
    from runtime import LLM

    offline = LLM(str(tiny_model), task="embed", pooling="mean", kv_cache_tokens=512)
    want = offline.embed(inputs)
    assert [d.index for d in got.data] == [0, 1]
    for data, vector in zip(got.data, want):
        assert data.embedding == pytest.approx(vector, abs=1e-5)
    tokens = sum(len(offline.tokenizer.encode(text)) for text in inputs)
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens
    row = await _row(plane, "surface-emb")
    assert (row.endpoint, row.prompt_tokens, row.completion_tokens) == ("embeddings", tokens, 0)
    assert row.cost == _cost(tokens, 0)
    theirs = plane.client(other)
    assert [m["id"] for m in (await theirs.get("/v1/models")).json()["data"]] == ["theirs"]
