"""Budgets and webhooks together: a call that crosses a budget's soft threshold reaches
the tenant's registered endpoint as one signed `budget.threshold` event, once per period,
through the real gateway, Postgres, a real replica and a real HTTP receiver."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest
import pytest_asyncio

from controlplane.webhooks.signing import verify
from tests.controlplane.conftest import make_settings, running_control_plane, started_static_pool
from tests.controlplane.support.webhook_receiver import serving_receiver
from tests.controlplane.test_budgets import CHAT, new_tenant, set_budget
from tests.controlplane.test_webhooks import register

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def receiver():
    async with serving_receiver() as receiver:
        yield receiver


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory, runtime_replica):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-budget-hooks"),
                             webhook_poll_s=0.02, webhook_allow_private_targets=True)
    async with started_static_pool(settings, [runtime_replica.base_url]) as pool:
        async with running_control_plane(settings, pool=pool) as plane:
            yield plane


async def test_a_soft_threshold_crossed_by_a_call_is_one_signed_webhook(plane, receiver, model_uri):
    key, key_id = await new_tenant(plane, model_uri, "bud-hook")
    client = plane.client(key)
    endpoint = await register(client, f"{receiver.base_url}/bud-hook")
    budget = await set_budget(client, scope="key", key=key_id, limit="1", soft_amount="0.000001")
    for _ in range(2):                          # the second call crosses nothing new
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200, response.text

    (got,) = await receiver.wait_for("/bud-hook", 1)
    assert verify(endpoint["secret"], got.headers["thawpool-signature"], got.body, tolerance_s=300)
    event = json.loads(got.body)
    assert event["type"] == "budget.threshold" and event["tenant_id"] == budget["tenant_id"]
    data = event["data"]
    assert (data["budget_id"], data["scope"], data["kind"]) == (budget["id"], "key", "soft")
    assert Decimal(data["spent"]) > 0 and Decimal(data["limit"]) == 1
    deliveries = (await client.get(f"/v1/webhooks/{endpoint['id']}/deliveries")).json()["data"]
    assert [d["event_type"] for d in deliveries] == ["budget.threshold"], "one event per budget, period, kind"
