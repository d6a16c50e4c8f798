"""Publishing and claiming on a real Postgres, with no app and no worker running: which
endpoints an event reaches, one event per dedupe key, and claims that two control
planes never share (FOR UPDATE SKIP LOCKED) and that come due again when a claim's
lease ends without its attempt recorded."""
import asyncio
import os
from datetime import datetime, timedelta, timezone

import pytest
import pytest_asyncio
from sqlalchemy import func, select

from controlplane.db import create_db_engine, sessionmaker
from controlplane.sealing import Sealer
from controlplane.store.tables import WebhookDelivery, WebhookEvent
from controlplane.store.tenants import create_tenant
from controlplane.webhooks import endpoints
from controlplane.webhooks.deliveries import Attempt, Next, claim, record
from controlplane.webhooks.endpoints import EndpointSpec
from controlplane.webhooks.events import BUDGET_THRESHOLD
from controlplane.webhooks.history import prune
from controlplane.webhooks.publisher import WebhookPublisher

pytestmark = pytest.mark.asyncio(loop_scope="session")
FAR = datetime(2100, 1, 1, tzinfo=timezone.utc)      # every delivery is due by then


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sessions(db_url):
    engine = create_db_engine(db_url)
    yield sessionmaker(engine)
    await engine.dispose()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(sessions):
    """Tenants a and b; endpoints: a's own, b's own, the operator's for a, the operator's
    for every event, a's disabled one, and a's for every type."""
    sealer, ids = Sealer(os.urandom(32)), {}
    async with sessions.begin() as session:
        a, b = await create_tenant(session, "wh-a"), await create_tenant(session, "wh-b")
        ids.update(a=a.id, b=b.id)
        for name, tenant, operator, types, enabled in [
                ("a_own", a.id, False, [BUDGET_THRESHOLD], True),
                ("b_own", b.id, False, [BUDGET_THRESHOLD], True),
                ("operator_a", a.id, True, [BUDGET_THRESHOLD], True),
                ("operator_all", None, True, ["*"], True),
                ("a_disabled", a.id, False, [BUDGET_THRESHOLD], False),
                ("a_every", a.id, False, ["*"], True)]:
            row, _ = await endpoints.create(session, EndpointSpec(
                f"http://127.0.0.1:9/{name}", types, enabled, None, tenant, operator), sealer)
            ids[name] = row.id
    return ids


async def reached(sessions, event_id) -> set[str]:
    async with sessions() as session:
        return set(await session.scalars(select(WebhookDelivery.endpoint_id)
                                         .where(WebhookDelivery.event_id == event_id)))


async def test_a_tenant_event_reaches_its_endpoints_and_the_operators(sessions, world):
    published = await WebhookPublisher(sessions).publish(world["a"], BUDGET_THRESHOLD,
                                                         {"n": 1}, "reach-a")
    expected = {world[n] for n in ("a_own", "operator_a", "operator_all", "a_every")}
    assert published.new and published.deliveries == 4
    assert await reached(sessions, published.event_id) == expected


async def test_a_platform_event_reaches_only_the_operators_every_event_endpoint(sessions, world):
    published = await WebhookPublisher(sessions).publish(None, BUDGET_THRESHOLD, {}, "reach-none")
    assert await reached(sessions, published.event_id) == {world["operator_all"]}


async def test_one_dedupe_key_is_one_event_however_many_publish_it(sessions, world):
    publishers = [WebhookPublisher(sessions) for _ in range(8)]
    results = await asyncio.gather(*(p.publish(world["b"], BUDGET_THRESHOLD, {"n": i}, "once")
                                     for i, p in enumerate(publishers)))
    assert sum(r.new for r in results) == 1
    assert len({r.event_id for r in results}) == 1
    assert await reached(sessions, results[0].event_id) == {world["b_own"], world["operator_all"]}


async def test_two_claims_at_once_never_share_a_delivery(sessions, world):
    await WebhookPublisher(sessions).publish(world["a"], BUDGET_THRESHOLD, {}, "claims")
    async with sessions.begin() as first, sessions.begin() as second:
        mine = await claim(first, FAR, lease_s=60, limit=100)
        theirs = await claim(second, FAR, lease_s=60, limit=100)    # while first holds its locks
    assert mine and not theirs
    ids = [c.delivery_id for c in mine]
    assert len(ids) == len(set(ids))
    async with sessions.begin() as session:          # leased: not due again before it ends
        assert await claim(session, FAR + timedelta(seconds=59), lease_s=60, limit=100) == []


async def test_a_lost_claim_comes_due_again_and_only_its_new_holder_records(sessions, world):
    event = (await WebhookPublisher(sessions).publish(world["b"], BUDGET_THRESHOLD, {},
                                                      "lease")).event_id
    later = FAR + timedelta(days=1)
    async with sessions.begin() as session:
        old = [c for c in await claim(session, later, 60, 100) if c.event_id == event]
    async with sessions.begin() as session:
        new = [c for c in await claim(session, later + timedelta(seconds=61), 60, 100)
               if c.event_id == event]
    assert len(old) == 2 and {c.delivery_id for c in new} == {c.delivery_id for c in old}
    assert {c.attempt for c in new} == {2}
    tried = Attempt(later, 1.0, 200, None)
    async with sessions.begin() as session:
        assert not await record(session, old[0], tried, Next("succeeded", None), later)
        mine = next(c for c in new if c.delivery_id == old[0].delivery_id)
        assert await record(session, mine, tried, Next("succeeded", None), later)
    async with sessions() as session:
        done = await session.get(WebhookDelivery, old[0].delivery_id)
    assert (done.status, done.attempts, done.next_attempt_at, done.claim_id) == (
        "succeeded", 2, None, None)


async def test_pruning_deletes_done_events_and_keeps_pending_ones(sessions, world):
    publisher = WebhookPublisher(sessions)
    done = (await publisher.publish(world["a"], BUDGET_THRESHOLD, {}, "prune-done")).event_id
    waiting = (await publisher.publish(world["a"], BUDGET_THRESHOLD, {}, "prune-pending")).event_id
    async with sessions.begin() as session:
        for delivery in await session.scalars(select(WebhookDelivery).where(
                WebhookDelivery.event_id == done)):
            delivery.status, delivery.next_attempt_at = "failed", None
    async with sessions.begin() as session:
        pruned = await prune(session, datetime.now(timezone.utc) + timedelta(seconds=1))
        assert await prune(session, datetime(2000, 1, 1, tzinfo=timezone.utc)) == 0
    async with sessions() as session:
        left = set(await session.scalars(select(WebhookEvent.id)))
        orphans = await session.scalar(select(func.count()).select_from(WebhookDelivery).where(
            WebhookDelivery.event_id == done))
    assert pruned >= 1 and done not in left and waiting in left and orphans == 0


async def test_a_disabled_endpoints_deliveries_wait_until_it_is_enabled(sessions, world):
    operator = endpoints.Viewer(world["a"], is_operator=True)
    async with sessions.begin() as session:
        row, _ = await endpoints.create(session, EndpointSpec(
            "http://127.0.0.1:9/paused", ["*"], True, None, world["b"], False), Sealer(os.urandom(32)))
    event = (await WebhookPublisher(sessions).publish(world["b"], BUDGET_THRESHOLD, {},
                                                      "paused")).event_id
    later = FAR + timedelta(days=7)

    async def claimed_for_it() -> list:
        async with sessions.begin() as session:
            return [c for c in await claim(session, later, 1, 1000)
                    if c.event_id == event and c.endpoint_id == row.id]

    async with sessions.begin() as session:
        await endpoints.update(session, operator, row.id, {"enabled": False})
    assert await claimed_for_it() == []
    async with sessions.begin() as session:
        await endpoints.update(session, operator, row.id, {"enabled": True})
    assert len(await claimed_for_it()) == 1
