"""Asynchronous function calls in the real Postgres: accepted running, answered, read by
their own tenant only, expired and swept, failed when a restart cut them, written again
after an outage; and end to end, a call's answer read from a control plane that started
after the one that ran it."""
import asyncio
import contextlib
from datetime import datetime, timedelta, timezone

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.gateway.async_calls import AsyncCalls, TooManyInFlight
from controlplane.db import create_db_engine, sessionmaker
from controlplane.gateway.async_call_rules import RESTARTED, expired_before, finished, new_call
from controlplane.store.tables import FunctionCall, Tenant
from controlplane.store import function_calls as store
from tests.controlplane.conftest import make_settings, running_control_plane, static_pool
from tests.functions.conftest import FunctionProcess
from tests.functions.test_function_deploy import upload

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]
T0 = datetime(2027, 4, 1, tzinfo=timezone.utc)
RETENTION_S = 60.0


class Clock:
    """Time that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sessions(db_url):
    engine = create_db_engine(db_url)
    yield sessionmaker(engine)
    await engine.dispose()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenants(sessions):
    """Two tenants' ids (the calls' rows refer to their tenant)."""
    rows = [Tenant(name=f"calls-{name}") for name in ("acme", "other")]
    async with sessions.begin() as session:
        session.add_all(rows)
    return rows[0].id, rows[1].id


async def rows(sessions, *call_ids) -> dict[str, FunctionCall]:
    async with sessions() as session:
        found = await session.scalars(select(FunctionCall).where(FunctionCall.id.in_(call_ids)))
        return {row.id: row for row in found}


async def answer_when(event: asyncio.Event, status: int, body: dict):
    await event.wait()
    return status, body


async def test_a_call_is_running_in_postgres_then_answered_to_its_tenant_only(sessions, tenants):
    acme, other = tenants
    clock, go = Clock(), asyncio.Event()
    calls = AsyncCalls(sessions, RETENTION_S, clock=clock)
    call = await calls.accept(acme, "sentiment", lambda: answer_when(go, 200, {"output": {"x": 1}}))
    assert (await rows(sessions, call.id))[call.id].status == "running", "committed before 202"
    assert (await calls.get(acme, call.id)).view()["status"] == "running"
    assert await calls.get(other, call.id) is None
    assert await calls.get(acme, "call-" + "0" * 32) is None and await calls.get(acme, "\x00") is None

    clock.advance(5)
    go.set()
    await calls.wait()
    done = (await calls.get(acme, call.id)).view()
    assert (done["status"], done["http_status"], done["output"]) == ("succeeded", 200, {"x": 1})
    assert (await rows(sessions, call.id))[call.id].finished_at == T0 + timedelta(seconds=5)
    assert await calls.get(other, call.id) is None
    clock.advance(RETENTION_S - 0.001)
    assert await calls.get(acme, call.id) is not None
    clock.advance(0.001)
    assert await calls.get(acme, call.id) is None, "expired: read as unknown before any sweep"
    assert call.id in await rows(sessions, call.id)


async def test_a_call_that_raises_ends_as_an_internal_error(sessions, tenants):
    async def broken():
        raise RuntimeError("secret detail")
    calls = AsyncCalls(sessions, RETENTION_S, clock=Clock())
    call = await calls.accept(tenants[0], "f", broken)
    await calls.wait()
    view = (await calls.get(tenants[0], call.id)).view()
    assert (view["status"], view["http_status"]) == ("failed", 500)
    assert view["error"]["message"] == "internal error", "no internals in a tenant's answer"


async def test_any_json_answer_is_stored_as_it_was(sessions, tenants):
    body = {"output": {"nul": "a\x00b", "surrogate": "\ud800", "big": 10 ** 30, "inf": float("inf"),
                       "nested": [{"ü": None}]}}
    call = finished(new_call(tenants[0], "f", T0), 200, body, T0)
    async with sessions.begin() as session:
        await store.add(session, call)
        assert await store.finish(session, call)
    async with sessions() as session:
        assert (await store.find(session, tenants[0], call.id)).body == body


async def test_a_start_fails_the_calls_left_running_and_only_those(sessions, tenants):
    acme, other = tenants
    ended = finished(new_call(acme, "f", T0), 200, {"output": {}}, T0)
    left = [new_call(acme, "f", T0), new_call(other, "g", T0)]
    async with sessions.begin() as session:
        await store.fail_running(session, 500, {}, T0)      # what earlier tests left running
    await add_calls(sessions, ended, *left)
    clock = Clock()
    clock.advance(30)
    calls = AsyncCalls(sessions, RETENTION_S, clock=clock)
    assert await calls.start() == 2
    views = [(await calls.get(c.tenant_id, c.id)).view() for c in left]
    assert [(v["status"], v["http_status"], v["error"]["code"]) for v in views] == [
        ("failed", 503, RESTARTED)] * 2
    assert (await calls.get(acme, ended.id)).view()["output"] == {}, "an ended call is kept"
    async with sessions.begin() as session:
        late = finished(left[0], 200, {"output": {"late": True}}, clock())
        assert not await store.finish(session, late), "the restart's answer stands"
    assert await calls.start() == 0


async def test_expired_calls_are_swept_in_bounded_batches(sessions, tenants):
    """A year before the other tests' calls, so the counts are this test's own."""
    acme, then = tenants[0], T0 - timedelta(days=365)
    cutoff = expired_before(then + timedelta(seconds=10 + RETENTION_S), RETENTION_S)
    old = [finished(new_call(acme, "f", then), 200, {}, then + timedelta(seconds=i)) for i in range(3)]
    kept = [finished(new_call(acme, "f", then), 200, {}, cutoff + timedelta(microseconds=1)),
            new_call(acme, "f", then)]                               # running: never expires
    await add_calls(sessions, *old, *kept)
    deleted = []
    for _ in range(3):
        async with sessions.begin() as session:
            deleted.append(await store.delete_expired(session, cutoff, limit=2))
    assert deleted == [2, 1, 0]
    assert set(await rows(sessions, *[c.id for c in [*old, *kept]])) == {c.id for c in kept}


async def test_accepting_a_call_sweeps_once_due(sessions, tenants):
    acme, clock = tenants[0], Clock()
    calls = AsyncCalls(sessions, 30, clock=clock)

    async def done():
        return 200, {"output": {}}
    await calls.accept(acme, "f", done)                           # the first sweep: nothing yet
    ended = finished(new_call(acme, "f", T0), 200, {}, T0)
    running = new_call(acme, "f", T0)
    await add_calls(sessions, ended, running)
    clock.advance(30)                                             # `ended` expired now
    await calls.accept(acme, "f", done)
    assert ended.id in await rows(sessions, ended.id), "no sweep: the last was 30 s ago"
    clock.advance(30)
    await calls.accept(acme, "f", done)
    await calls.wait()
    assert set(await rows(sessions, ended.id, running.id)) == {running.id}


async def add_calls(sessions, *calls) -> None:
    """Rows as accepted, then finished where the call is."""
    async with sessions.begin() as session:
        for call in calls:
            await store.add(session, call)
            if call.finished_at is not None:
                assert await store.finish(session, call)


class FlakySessions:
    """The real sessionmaker, whose first `begin()` calls fail as an outage would."""

    def __init__(self, sessions, failures: int):
        self.sessions, self.failures = sessions, failures

    def __call__(self):
        return self.sessions()

    def begin(self):
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError("postgres is down")
        return self.sessions.begin()


async def test_an_answer_is_written_once_postgres_is_back(sessions, tenants):
    async def done():
        return 200, {"output": {"kept": True}}
    flaky = FlakySessions(sessions, failures=0)
    calls = AsyncCalls(flaky, RETENTION_S, clock=Clock(), retry_s=0)
    call = await calls.accept(tenants[0], "f", done)
    flaky.failures = 3                                   # the answer's first writes fail
    await calls.wait()
    assert flaky.failures == 0
    assert (await calls.get(tenants[0], call.id)).view()["output"] == {"kept": True}


async def test_calls_in_flight_are_capped_per_tenant_and_freed_as_they_end(sessions, tenants):
    acme, other = tenants
    go = asyncio.Event()
    calls = AsyncCalls(sessions, RETENTION_S, clock=Clock())
    for _ in range(2):
        await calls.accept(acme, "f", lambda: answer_when(go, 200, {}), tenant_limit=2)
    with pytest.raises(TooManyInFlight) as refused:
        await calls.accept(acme, "f", lambda: answer_when(go, 200, {}), tenant_limit=2)
    assert refused.value.param == "max_async_calls"
    assert calls.in_flight_for(acme) == 2, "a refusal holds no slot"
    await calls.accept(other, "f", lambda: answer_when(go, 200, {}), tenant_limit=2)
    go.set()
    await calls.wait()
    assert calls.in_flight_for(acme) == 0
    await calls.accept(acme, "f", lambda: answer_when(go, 200, {}), tenant_limit=2)
    await calls.wait()


async def test_past_its_async_call_quota_a_tenant_gets_429_and_others_are_served(
        db_url, s3_server, models_bucket, probe_package, tmp_path):
    """Batches of 2 that wait for a full one: a call of one item stays running."""
    package = probe_package(max_batch_size=2)
    settings = make_settings(db_url, s3_server, tmp_path / "cp", quota_max_async_calls=1)
    async with function_pool(package, settings, tmp_path) as pool:
        async with running_control_plane(settings, pool=pool) as plane:
            flood = plane.client(await plane.tenant_key("flood-acme"))
            calm = plane.client(await plane.tenant_key("flood-calm"))
            for tenant, client in (("flood-acme", flood), ("flood-calm", calm)):
                created = await client.post("/v1/deployments", json={
                    "name": "probe", "kind": "function",
                    "model_uri": upload(package, s3_server, models_bucket, f"{tenant}/probe")})
                assert created.status_code == 201, created.text
            first = await flood.post("/v1/functions/probe/invoke", params={"async": "true"},
                                     json={"input": {"echo": 1}})
            assert first.status_code == 202, first.text
            refused = await flood.post("/v1/functions/probe/invoke", params={"async": "true"},
                                       json={"input": {"echo": 2}})
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"]
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == ("too_many_async_calls", "max_async_calls")
            served = await calm.post("/v1/functions/probe/invoke", params={"async": "true"},
                                     json={"input": {"echo": 3}})
            assert served.status_code == 202, "another tenant's calls are not held back"
            await plane.app.state.async_calls.wait()       # the two single calls made a batch
            again = await flood.post("/v1/functions/probe/invoke", params={"async": "true"},
                                     json={"inputs": [{"echo": 4}, {"echo": 5}]})
            assert again.status_code == 202, "an ended call frees its slot"
            await plane.app.state.async_calls.wait()


async def test_an_async_call_outlives_a_restart_of_the_control_plane(db_url, s3_server, models_bucket,
                                                                     probe_package, tmp_path):
    """A finished call is read back from the next control plane; one cut by the restart is
    failed with a retryable answer. Batches of 2 that wait for a full one: a call of two
    items runs at once, a call of one is still waiting when the first plane stops."""
    package = probe_package(max_batch_size=2)
    settings = make_settings(db_url, s3_server, tmp_path / "cp")
    async with function_pool(package, settings, tmp_path) as pool:
        async with running_control_plane(settings, pool=pool) as plane:
            client = plane.client(await plane.tenant_key("restart-acme"))
            created = await client.post("/v1/deployments", json={
                "name": "probe", "kind": "function",
                "model_uri": upload(package, s3_server, models_bucket, "restart-acme/probe")})
            assert created.status_code == 201, created.text
            done = await client.post("/v1/functions/probe/invoke", params={"async": "true"},
                                     json={"inputs": [{"echo": 1}, {"echo": 2}]})
            assert done.status_code == 202, done.text
            await plane.app.state.async_calls.wait()
            cut = await client.post("/v1/functions/probe/invoke", params={"async": "true"},
                                    json={"input": {"echo": 3}})
            assert cut.status_code == 202 and cut.json()["status"] == "running"

        async with running_control_plane(settings, pool=pool) as plane:
            client = plane.client(await plane.tenant_key("restart-acme"))
            answer = (await client.get(f"/v1/functions/calls/{done.json()['id']}")).json()
            assert answer["status"] == "succeeded", answer
            assert [o["echo"] for o in answer["outputs"]] == [1, 2]
            lost = (await client.get(f"/v1/functions/calls/{cut.json()['id']}")).json()
            assert (lost["status"], lost["http_status"], lost["error"]["code"]) == (
                "failed", 503, RESTARTED)
            other = plane.client(await plane.tenant_key("restart-other"))
            unknown = await client.get("/v1/functions/calls/call-" + "f" * 32)
            for call_id in (done.json()["id"], cut.json()["id"]):
                theirs = await other.get(f"/v1/functions/calls/{call_id}")
                assert (theirs.status_code, theirs.json()["error"]["code"]) == (
                    unknown.status_code, unknown.json()["error"]["code"]) == (404, "call_not_found")


@contextlib.asynccontextmanager
async def function_pool(package, settings, tmp_path):
    """A real function server on the package behind a static pool, both stopped after."""
    server = FunctionProcess(package, tmp_path / "function.log")
    pool = static_pool(settings, [server.base_url])
    pool.lease_headers = server.headers
    await pool.start()
    try:
        server.wait()
        yield pool
    finally:
        await pool.stop()
        server.stop()

