"""The Responses API (issue 35) through the control plane and a real replica, with the
official openai client: text with instructions, a previous_response_id chain (the earlier
turn prepended, the instructions not), streaming (`responses.stream` and raw typed events),
a function tool call and its result sent back, json_schema output, retrieve and delete,
isolation between tenants, a bad input's 400 naming the field (no usage row), one usage
row per call with endpoint `responses`, and the retention sweep."""
from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import jsonschema
import openai
import pytest
import pytest_asyncio
from sqlalchemy import func, select

from controlplane.gateway.response_retention import Retention
from controlplane.gateway.responses import Responses
from controlplane.store.tables import StoredResponse, UsageEvent, utcnow
from tests.controlplane.conftest import pooled_control_plane
from tests.runtime.test_tool_prompt import tools_model
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(600)]
INPUT, OUTPUT = Decimal("1000"), Decimal("3000")      # per million tokens
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["answer", "confidence"], "additionalProperties": False}


@pytest.fixture(scope="module")
def agent_uri(model_factory, tmp_path_factory, s3_server, models_bucket) -> str:
    """A tiny Llama whose template takes `tools` (Qwen's), with room for them in context."""
    model = tools_model(model_factory, tmp_path_factory.mktemp("responses-model") / "model")
    return upload_model(model, s3_server.client(), models_bucket, "tiny/responses-llama")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-responses")) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def keys(plane, agent_uri):
    key, other = await plane.tenant_key("responder"), await plane.tenant_key("bystander")
    await plane.set_price(tenant="responder", input_per_mtok=str(INPUT), output_per_mtok=str(OUTPUT),
                          cached_input_per_mtok=str(INPUT))
    created = await plane.client(key).post("/v1/deployments", json={
        "name": "agent", "model_uri": agent_uri, "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 4096}})
    assert created.status_code == 201, created.text
    return key, other


@pytest_asyncio.fixture(loop_scope="session")
async def oa(plane, keys):
    client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=keys[0], max_retries=0, timeout=580)
    yield client
    await client.close()


async def _rows(plane, request_id: str) -> list[UsageEvent]:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return list(await session.scalars(select(UsageEvent).where(UsageEvent.request_id == request_id)))


def _rid(name: str) -> dict:
    return {"extra_headers": {"x-request-id": name}}


async def test_text_instructions_and_a_chain_billed_once_each(plane, oa):
    first = await oa.responses.create(model="agent", input="Hello there", instructions="Answer briefly.",
                                      max_output_tokens=6, temperature=0, metadata={"case": "chain"},
                                      **_rid("resp-first"))
    assert first.id.startswith("resp_") and first.object == "response" and first.model == "agent"
    assert first.status in ("completed", "incomplete") and first.metadata == {"case": "chain"}
    assert first.instructions == "Answer briefly." and 0 < first.usage.output_tokens <= 6
    bare = await oa.responses.create(model="agent", input="Hello there", max_output_tokens=1, store=False)
    assert first.usage.input_tokens > bare.usage.input_tokens        # the instructions were read

    second = await oa.responses.create(model="agent", input="And again?", previous_response_id=first.id,
                                       max_output_tokens=4, temperature=0, **_rid("resp-second"))
    assert second.previous_response_id == first.id and second.instructions is None
    # the earlier turn is prepended as a chat would carry it; its instructions are not
    chat = await oa.chat.completions.create(model="agent", max_tokens=1, messages=[
        {"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And again?"}])
    assert second.usage.input_tokens == chat.usage.prompt_tokens

    for request_id, response in (("resp-first", first), ("resp-second", second)):
        (row,) = await _rows(plane, request_id)
        assert (row.endpoint, row.status, row.prompt_tokens, row.completion_tokens) == (
            "responses", "ok", response.usage.input_tokens, response.usage.output_tokens)
        assert row.cost == (row.prompt_tokens * INPUT + row.completion_tokens * OUTPUT) / 1_000_000


async def test_streams_give_the_unary_answer_with_typed_events(plane, oa):
    unary = await oa.responses.create(model="agent", input="Tell me a story", max_output_tokens=8,
                                      temperature=0, store=False)
    async with oa.responses.stream(model="agent", input="Tell me a story", max_output_tokens=8,
                                   temperature=0, extra_headers={"x-request-id": "resp-stream"}) as stream:
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    final = events[-1].response     # completed, or incomplete when max_output_tokens cut it
    assert final.output_text == unary.output_text and final.usage.output_tokens == unary.usage.output_tokens
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.completed" if final.status == "completed" else "response.incomplete")
    if final.output_text:
        assert {"response.output_item.added", "response.content_part.added", "response.output_text.delta",
                "response.output_text.done", "response.content_part.done",
                "response.output_item.done"} <= set(kinds)
    (row,) = await _rows(plane, "resp-stream")
    assert (row.endpoint, row.status, row.completion_tokens) == ("responses", "ok", final.usage.output_tokens)
    assert (await oa.responses.retrieve(final.id)).output_text == final.output_text   # stored

    raw = await oa.responses.create(model="agent", input="Tell me a story", max_output_tokens=8,
                                    temperature=0, stream=True, store=False)
    numbers = [event.sequence_number async for event in raw]
    assert numbers == list(range(len(numbers)))


async def test_a_function_call_and_its_result_continue_the_conversation(plane, oa):
    named = {"type": "function", "name": "get_weather"}
    called = await oa.responses.create(model="agent", input="What is the weather in Paris?", tools=TOOLS,
                                       tool_choice=named, max_output_tokens=120, temperature=0)
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), PARAMS)

    async with oa.responses.stream(model="agent", input="What is the weather in Paris?", tools=TOOLS,
                                   tool_choice=named, max_output_tokens=120, temperature=0) as stream:
        streamed = await stream.get_final_response()
    (again,) = [item for item in streamed.output if item.type == "function_call"]
    assert (again.name, again.arguments) == (call.name, call.arguments)

    answered = await oa.responses.create(
        model="agent", previous_response_id=called.id, tools=TOOLS, max_output_tokens=4, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert answered.usage.input_tokens > called.usage.input_tokens      # the call and its result were read


async def test_json_schema_output_matches_the_schema(oa):
    response = await oa.responses.create(
        model="agent", input="Is it going to rain?", max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "forecast", "schema": SCHEMA, "strict": True}})
    assert response.text.format.type == "json_schema"
    jsonschema.validate(json.loads(response.output_text), SCHEMA)


async def test_retrieve_delete_and_isolation_between_tenants(plane, keys, oa):
    made = await oa.responses.create(model="agent", input="Remember me", max_output_tokens=2)
    unstored = await oa.responses.create(model="agent", input="Forget me", max_output_tokens=2, store=False)
    got = await oa.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump()
    with pytest.raises(openai.NotFoundError):
        await oa.responses.retrieve(unstored.id)

    other = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=keys[1], max_retries=0, timeout=60)
    try:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError) as refused:
            await other.responses.create(model="agent", input="x", previous_response_id=made.id,
                                         **_rid("resp-theirs"))
        assert refused.value.body["param"] == "previous_response_id"
    finally:
        await other.close()
    assert await _rows(plane, "resp-theirs") == []

    await oa.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await oa.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await oa.responses.delete(made.id)


@pytest.mark.parametrize("fields, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"not": {"type": "string"}}}}},
     "text.format"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
])
async def test_bad_input_is_a_400_naming_the_field_and_bills_nothing(plane, oa, fields, param):
    request_id = f"resp-bad-{param}"
    with pytest.raises(openai.BadRequestError) as refused:
        await oa.responses.create(model="agent", **fields, **_rid(request_id))
    assert refused.value.body["param"] == param, refused.value.body
    assert await _rows(plane, request_id) == []


async def test_the_sweep_deletes_what_retention_let_expire(plane, oa):
    kept = await oa.responses.create(model="agent", input="Keep me a while", max_output_tokens=2)
    state = plane.app.state
    later = Responses(state.gateway, state.sessions, Retention(60), clock=lambda: utcnow() + timedelta(hours=1))
    assert await later.sweep() >= 1
    async with state.sessions() as session:
        left = await session.scalar(select(func.count()).select_from(StoredResponse).where(
            StoredResponse.id == kept.id))
    assert left == 0
    with pytest.raises(openai.NotFoundError):
        await oa.responses.retrieve(kept.id)
