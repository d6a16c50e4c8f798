"""Serving through a Postgres outage (the module's own Postgres, stopped): what memory
holds keeps working (keys, deployments, prices, quotas), usage waits in the outbox and
lands when Postgres is back; what memory cannot answer is 503 with Retry-After, never 500."""
import json
from decimal import Decimal
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.auth.keys import generate_key
from controlplane.store.tables import UsageEvent
from controlplane.store.desired_state import PostgresDesiredState
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.functions.test_function_deploy import upload
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
PROBE = Path(__file__).resolve().parents[1] / "functions" / "packages" / "probe"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "ignore_eos": True}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(own_pg, s3_server, runtime_replica, tmp_path_factory):
    settings = make_settings(own_pg.url, s3_server, tmp_path_factory.mktemp("cp-outage"),
                             db_connect_timeout_s=1, db_statement_timeout_s=2,
                             db_pool_timeout_s=1, outbox_retry_s=0.2)
    try:
        async with running_control_plane(settings, base_urls=[runtime_replica.base_url]) as plane:
            yield plane
    finally:
        own_pg.start()


async def test_known_keys_are_served_while_postgres_is_down(plane, own_pg, model_uri):
    key = await plane.tenant_key("steady")
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={"name": "chat", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    await plane.set_price(tenant="steady", input_per_mtok="2", output_per_mtok="4")
    budget = await client.put("/v1/budgets", json={"scope": "deployment", "deployment": "chat", "limit": "100"})
    assert budget.status_code == 201, budget.text        # none can be checked without Postgres
    assert (await client.post("/v1/chat/completions", json=CHAT,
                              headers={"x-request-id": "budgeted-before"})).status_code == 200
    desired = PostgresDesiredState(plane.app.state.sessions, plane.app.state.settings.default_quota,
                                   plane.app.state.sealer)
    specs = await desired.revisions()

    own_pg.stop()
    assert await desired.revisions() == specs, "the pool keeps the desired state it last read"
    served = await client.post("/v1/chat/completions", json=CHAT,
                               headers={"x-request-id": "outage-unary"})
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 4
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True},
                             headers={"x-request-id": "outage-stream"}) as response:
        assert response.status_code == 200
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    unknown = plane.client(generate_key().secret)          # a key this plane has not seen
    for refused in [await unknown.post("/v1/chat/completions", json=CHAT),
                    await client.post("/v1/deployments", json={"name": "new", "model_uri": model_uri}),
                    await client.get("/v1/billing/report")]:
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "database_unavailable"
    await eventually(lambda: plane.app.state.writer.outbox.depth >= 2, timeout_s=30,
                     what="both calls' usage in the outbox")

    own_pg.start()
    rows = await eventually(lambda: _usage(plane, "outage-unary", "outage-stream"), timeout_s=60,
                            what="the outbox replayed on its own once Postgres is back")
    assert {r.request_id: (r.status, r.completion_tokens) for r in rows} == {
        "outage-unary": ("ok", 4), "outage-stream": ("ok", 4)}
    assert all(r.cost > 0 for r in rows), "priced at the price memory held"
    report = await client.get("/v1/billing/report", params={"group_by": "deployment"})
    assert report.status_code == 200 and json.loads(report.text)["totals"]["requests"] == 3
    # served unchecked while Postgres was away, and counted in the budget once billed
    held = (await client.get(f"/v1/budgets/{budget.json()['id']}")).json()
    before = await _usage(plane, "budgeted-before")
    assert held["reserved"] == "0" and Decimal(held["spent"]) == before[0].cost + sum(r.cost for r in rows)


async def _usage(plane, *request_ids):
    async with plane.app.state.sessions() as session:
        rows = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.request_id.in_(request_ids))))
    return rows if len(rows) == len(request_ids) else None


async def test_an_async_function_call_is_refused_503_while_postgres_is_down(plane, own_pg, s3_server,
                                                                           models_bucket):
    """The call's row must be committed before its 202: without Postgres there is no 202."""
    key = await plane.tenant_key("steady-fn")
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={
        "name": "probe", "kind": "function",
        "model_uri": upload(PROBE, s3_server, models_bucket, "steady-fn/probe")})
    assert created.status_code == 201, created.text
    own_pg.stop()
    try:
        for refused in [await client.post("/v1/functions/probe/invoke", params={"async": "true"},
                                          json={"input": {"echo": 1}}),
                        await client.get("/v1/functions/calls/call-" + "0" * 32)]:
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["code"] == "database_unavailable"
    finally:
        own_pg.start()
    assert plane.app.state.async_calls.in_flight == 0, "nothing runs for a call that was refused"
