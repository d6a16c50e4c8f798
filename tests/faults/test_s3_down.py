"""Fault 3: S3 stopped during a cold start. The calls waiting for the thaw get 503 with
Retry-After within the acquire timeout (the client gives up only a little after it),
are billed nothing, no replica is left pulling or holding its slot, a deploy meanwhile
is a 503 too (never a 500), and the first call after S3 is back thaws the deployment
normally."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from tests.faults.bill import ReplicaWatch, lifetimes, reconcile
from tests.faults.scenario import Scenario
from tests.faults.stack import ACQUIRE_TIMEOUT_S
from tests.faults.traffic import client
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(300)
WAITING = 4


@pytest.fixture(scope="module")
def cold_model_uri(platform, model_factory) -> str:
    """A model no node has cached, so its cold start must read S3."""
    return platform.upload(model_factory(arch="llama", seed=3), "never-cached")


async def test_s3_down_during_cold_start(stack, cold_model_uri):
    scenario = Scenario.begin(stack, "s3-down", cold_model_uri)
    # the client waits the acquire timeout and a margin: a 503 must come before it gives up
    scenario.api = client(stack.base_url, scenario.key, timeout_s=ACQUIRE_TIMEOUT_S + 15)
    with ReplicaWatch(stack.plane) as watch:
        stack.stop_s3()
        try:
            waiting = await asyncio.gather(*(scenario.call() for _ in range(WAITING)))
            deploy = await asyncio.to_thread(stack.try_deploy, scenario.key, "while-s3-is-down", cold_model_uri)
            await eventually(lambda: _none_held(stack, scenario.tenant), timeout_s=60,
                             what="no lifetime of the failed cold starts left open")
        finally:
            await asyncio.to_thread(stack.start_s3)
        assert [c.status for c in waiting] == [503] * WAITING, waiting
        assert all(c.retry_after and int(c.retry_after) >= 1 for c in waiting), waiting
        assert all((c.prompt_tokens, c.completion_tokens) == (0, 0) for c in waiting)
        assert deploy.status_code == 503 and int(deploy.headers["retry-after"]) >= 1, deploy.text
        await scenario.warm()          # thaws normally once S3 is back
        await scenario.finish(watch)

    code, out = reconcile(stack.pg.url, scenario.started, datetime.now(timezone.utc))
    assert code == 0, out


async def _none_held(stack, tenant: str) -> bool:
    """Every lifetime of the tenant is closed: no replica stuck holding a slot."""
    return all(r["stopped_at"] is not None for r in await lifetimes(stack.pg.libpq_uri, tenant))
