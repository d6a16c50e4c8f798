"""Structured outputs through the control plane: the official openai client, a tiny model
deployed from S3, a real replica. A schema the grammar engine cannot enforce is a 400
before any replica thaws; a good one is enforced, streamed and not."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.controlplane.conftest import (cpu_pool_settings, create_database, drop_database, make_settings,
                                         real_pool, running_control_plane)
from tests.support.model_factory import upload_model

pytestmark = pytest.mark.timeout(600)

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["answer", "confidence"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Is it going to rain?"}]


@pytest_asyncio.fixture(scope="module")
async def plane(pg_server, s3_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e-structured")
    from controlplane.db import migrate_async

    db_url = await create_database(pg_server)
    await migrate_async(db_url)
    settings = make_settings(db_url, s3_server, tmp / "cp", acquire_timeout_s=280)
    try:
        async with running_control_plane(
                settings, pool_factory=real_pool(cpu_pool_settings(s3_server, tmp / "cache", load_timeout_s=240)),
                catalogue="s3://e2e-structured/tiny/") as plane:
            yield plane
    finally:
        await drop_database(pg_server, db_url)


async def test_refused_at_the_edge_then_enforced_by_the_replica(plane, tiny_model, s3_server):
    s3_server.ensure_bucket("e2e-structured")
    model_uri = upload_model(tiny_model, s3_server.client(), "e2e-structured", "tiny/json")
    key = await plane.tenant_key("json-tenant")
    created = await plane.client(key).post("/v1/deployments", json={
        "name": "json", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 600},
        "engine": {"kv_cache_tokens": 512}})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]
    client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=300)
    try:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="json", messages=MESSAGES, max_tokens=8, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}})
        assert '"not"' in info.value.body["message"]
        assert not plane.app.state.pool.revision_status(revision_id).replicas, "nothing thawed for a 400"

        fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA}}
        full = await client.chat.completions.create(model="json", messages=MESSAGES, max_tokens=64,
                                                    temperature=0, response_format=fmt)
        content = full.choices[0].message.content
        jsonschema.validate(json.loads(content), SCHEMA)
        stream = await client.chat.completions.create(model="json", messages=MESSAGES, max_tokens=64,
                                                      temperature=0, response_format=fmt, stream=True)
        assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == content
    finally:
        await client.close()
