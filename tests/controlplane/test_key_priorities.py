"""Priorities per API key (controlplane/auth/priorities.py) through the real control plane:
the key API stores and shows them, a call runs at its key's default or at what it asks
within the key's range, and one outside it is refused (403 naming `priority`) before the
pool is asked for a replica."""
from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio

from controlplane.cli.main import main
from tests.controlplane.conftest import make_settings, running_control_plane, started_static_pool
from wire.priority import BATCH_PRIORITY, HIGHEST, INTERACTIVE_PRIORITY

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPT = {"model": "chat", "prompt": "hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def settings(db_url, s3_server, tmp_path_factory):
    return make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-prio"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pool(settings, runtime_replica):
    async with started_static_pool(settings, [runtime_replica.base_url]) as pool:
        yield pool


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(settings, pool, model_uri):
    async with running_control_plane(settings, pool=pool) as plane:
        key = await plane.tenant_key("prio")
        created = await plane.client(key).post("/v1/deployments", json={"name": "chat", "model_uri": model_uri})
        assert created.status_code == 201, created.text
        yield plane


async def _key(plane, **priorities) -> dict:
    response = await plane.admin.post("/v1/tenants/prio/keys", json={"scopes": ["invoke"], **priorities})
    assert response.status_code == 201, response.text
    return response.json()


async def test_keys_store_and_show_their_priorities(plane):
    made = await _key(plane, priority_min=BATCH_PRIORITY, name="batch")
    assert (made["priority_min"], made["priority_max"], made["priority_default"]) == (BATCH_PRIORITY, None, None)
    assert made["priority_range"] == [BATCH_PRIORITY, HIGHEST]
    assert made["priority_effective_default"] == BATCH_PRIORITY
    listed = (await plane.admin.get("/v1/tenants/prio/keys")).json()["data"]
    assert next(k for k in listed if k["prefix"] == made["prefix"])["priority_min"] == BATCH_PRIORITY


@pytest.mark.parametrize("body, field", [
    ({"priority_min": 5, "priority_max": 4}, "priority_max"),
    ({"priority_default": -3}, "priority_default"),
    ({"priority_min": "0"}, "priority_min"),
    ({"priority_max": 2 ** 31}, "priority_max"),
])
async def test_a_key_with_a_bad_range_is_refused_by_name(plane, body, field):
    response = await plane.admin.post("/v1/tenants/prio/keys", json={"scopes": ["invoke"], **body})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == field


async def test_calls_run_at_their_keys_default_or_what_they_ask_within_range(plane, pool):
    batch = plane.client((await _key(plane, priority_min=BATCH_PRIORITY))["key"])
    plain = plane.client((await _key(plane))["key"])
    for client, body, expected in [(batch, PROMPT, BATCH_PRIORITY),
                                   (batch, {**PROMPT, "priority": 200}, 200),
                                   (plain, PROMPT, INTERACTIVE_PRIORITY),
                                   (plain, {**PROMPT, "priority": BATCH_PRIORITY}, BATCH_PRIORITY)]:
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert pool.calls[-1].priority == expected


@pytest.mark.parametrize("priorities, asked, status, code", [
    ({"priority_min": BATCH_PRIORITY}, INTERACTIVE_PRIORITY, 403, "priority_not_allowed"),
    ({}, -1, 403, "priority_not_allowed"),
    ({"priority_max": 10}, BATCH_PRIORITY, 403, "priority_not_allowed"),
    ({}, "high", 400, None),
    ({}, 1.5, 400, None),
])
async def test_a_call_outside_its_range_is_refused_before_any_replica(plane, pool, priorities, asked,
                                                                        status, code):
    client = plane.client((await _key(plane, **priorities))["key"])
    acquired = len(pool.calls)
    for endpoint, body in [("completions", PROMPT),
                           ("chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}),
                           ("embeddings", {"model": "chat", "input": "hi"})]:
        response = await client.post(f"/v1/{endpoint}", json={**body, "priority": asked})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("priority", code)
    assert len(pool.calls) == acquired


async def test_the_cli_makes_a_batch_key(plane, capsys):
    auth = ["--url", plane.base_url, "--key", plane.admin_key, "--json"]
    code = await asyncio.to_thread(main, ["keys", "create", "--tenant", "prio", "--priority-min", "100",
                                          "--priority-default", "150", *auth])
    made = json.loads(capsys.readouterr().out)
    assert code == 0 and (made["priority_min"], made["priority_effective_default"]) == (100, 150)
    code = await asyncio.to_thread(main, ["keys", "create", "--tenant", "prio", "--priority-min", "5",
                                          "--priority-max", "1", *auth])
    assert code == 1 and "priority_max" in capsys.readouterr().err
