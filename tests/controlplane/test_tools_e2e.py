"""Tools through the control plane and the real pool (issue 17), with the official openai
client: a named tool_choice is a valid call of that function, streamed deltas assemble
to the same call, the row bills the tokens the client was told of, and a bad tool_choice
is refused with a 400 naming it and no usage row (that it thaws nothing is in
tests/controlplane/test_gateway.py's REFUSED_AT_THE_EDGE)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import UsageEvent
from tests.controlplane.conftest import pooled_control_plane
from tests.runtime.test_tool_prompt import tools_model
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tools_model_uri(model_factory, tmp_path_factory, s3_server, models_bucket) -> str:
    """A tiny Llama whose template takes `tools` (Qwen's), with room for them in context."""
    model = tools_model(model_factory, tmp_path_factory.mktemp("tools-model") / "model")
    return upload_model(model, s3_server.client(), models_bucket, "tiny/tools-llama")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-tools")) as plane:
        yield plane


async def _row(plane, request_id: str):
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return await session.scalar(select(UsageEvent).where(UsageEvent.request_id == request_id))


async def test_a_named_tool_call_is_served_streamed_and_billed(plane, tools_model_uri):
    key = await plane.tenant_key("tools")
    created = await plane.client(key).post("/v1/deployments", json={
        "name": "agent", "model_uri": tools_model_uri, "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 2048}})
    assert created.status_code == 201, created.text
    oa = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=280)
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            await oa.chat.completions.create(
                model="agent", messages=MESSAGES, tools=TOOLS, max_tokens=8,
                tool_choice={"type": "function", "function": {"name": "not_offered"}},
                extra_headers={"x-request-id": "tools-bad"})
        assert "tool_choice" in str(refused.value)

        full = await oa.chat.completions.create(
            model="agent", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=120,
            temperature=0, extra_headers={"x-request-id": "tools-full"})
        choice = full.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), PARAMS)

        stream = await oa.chat.completions.create(
            model="agent", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=120,
            temperature=0, stream=True, stream_options={"include_usage": True})
        names, arguments, usage = "", "", None
        async for chunk in stream:
            usage = chunk.usage or usage
            for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                names += delta_call.function.name or ""
                arguments += delta_call.function.arguments or ""
        assert (names, arguments) == (call.function.name, call.function.arguments)
        assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    finally:
        await oa.close()
    row = await _row(plane, "tools-full")
    assert (row.status, row.prompt_tokens, row.completion_tokens) == (
        "ok", full.usage.prompt_tokens, full.usage.completion_tokens)
    assert await _row(plane, "tools-bad") is None
