"""What a replica reports about itself, range-checked where the pool reads it: its
served-token counters (/stats), its load and wake timings (/health, /wake) and the host
memory it holds asleep (/sleep). A real HTTP server answers as a hostile replica would;
a number out of range is never kept (a counter past BIGINT, NaN seconds, a sleeper that
claims the node's whole host-memory budget)."""
from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pool.api import RevisionSpec
from pool.capacity import Capacity
from pool.clock import Clock
from pool.in_memory import EventLog
from pool.health import served_tokens
from pool.placement import Placed
from pool.registry import ManagedReplica
from pool.replica import Replica, ReplicaState
from pool.replica_events import ReplicaEvents
from pool.settings import PoolSettings
from pool.sleep_tier import SleepTier
from tests.controlplane.support.servers import serve
from tests.support.live_handle import LiveHandle as Handle
from wire.replica_control import MAX_STAGES, Health

pytestmark = pytest.mark.asyncio(loop_scope="session")
WEIGHT_BYTES = 1000




def hostile(answer: Any) -> Starlette:
    """A replica answering `answer` (NaN and huge numbers as they are) on every path."""
    async def reply(request: Request) -> Response:
        return Response(json.dumps(answer), media_type="application/json")
    return Starlette(routes=[Route(path, reply, methods=["GET", "POST"])
                             for path in ("/stats", "/sleep", "/wake")])


@pytest.mark.parametrize("stats, read", [
    ({"prompt_tokens": 120, "completion_tokens": 48}, (120, 48)),
    ({"prompt_tokens": 2 ** 70, "completion_tokens": 1}, None),       # past BIGINT
    ({"prompt_tokens": -1, "completion_tokens": 1}, None),
    ({"prompt_tokens": 1.0e300, "completion_tokens": 1}, None),
    ({"prompt_tokens": math.nan, "completion_tokens": 1}, None),
    ({"prompt_tokens": "12", "completion_tokens": 1}, None),
    ({"prompt_tokens": True, "completion_tokens": 1}, None),
    ({"prompt_tokens": 12}, None),
    (["prompt_tokens", 12], None),
])
async def test_served_token_counters_out_of_range_are_not_read(stats, read):
    async with serve(hostile(stats)) as base, httpx.AsyncClient() as http:
        assert await served_tokens(Handle("r", base), http) == read


async def test_load_stages_keep_only_finite_seconds_in_range():
    timings = {"weights_s": 1.5, "nan_s": math.nan, "inf_s": math.inf, "negative_s": -2.0,
               "years_s": 1e12, "huge_int_s": 10 ** 400, "flag_s": True, "text_s": "3",
               "x" * 10_000: 0.25}
    stages = Health.parse({"status": "ready", "load_timings": timings}).load_timings
    assert stages == {"weights_s": 1.5, "x" * 64: 0.25}
    many = Health.parse({"status": "ready", "load_timings": {f"s{i}": 0.1 for i in range(100_000)}})
    assert len(many.load_timings) == MAX_STAGES


async def test_wake_stages_are_bounded_like_load_stages():
    """What a woken replica reports becomes its wake record only within the same bounds."""
    settings = PoolSettings()
    answer = {"status": "ready", "wake_timings": {"weights_s": 0.5, "nan_s": math.nan,
                                                  "forever_s": 1e12, **{f"s{i}": 0.1 for i in range(100)}}}
    async with serve(hostile(answer)) as base, httpx.AsyncClient() as http:
        tier = SleepTier(settings, None, Capacity(settings), ReplicaEvents(EventLog(), Clock()),
                         http, Clock())
        managed = sleeping_replica(base)
        await tier.wake(managed)
    stages = managed.replica.wake_stages
    assert len(stages) == MAX_STAGES and stages["weights_s"] == 0.5
    assert "nan_s" not in stages and "forever_s" not in stages


def sleeping_replica(base_url: str) -> ManagedReplica:
    spec = RevisionSpec("rev", "dep", "ten", "s3://b/m/", gpu_count=1)
    managed = ManagedReplica(Replica("r", "rev", 0.0, Clock().utc()), spec)
    for state in (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY,
                  ReplicaState.DRAINING):
        managed.replica.move(state, 0.0, Clock().utc())
    managed.placed, managed.handle, managed.weight_bytes = Placed("n", ("n/cpu0",), 10), \
        Handle("r", base_url), WEIGHT_BYTES
    return managed


@pytest.mark.parametrize("reported, counted", [
    (600, 600),                            # what it says, within the room made for it
    (10 ** 15, WEIGHT_BYTES),              # the node's whole budget and more
    (-10 ** 15, WEIGHT_BYTES),             # room for everyone else
    (math.nan, WEIGHT_BYTES),
    (True, WEIGHT_BYTES),
    ("600", WEIGHT_BYTES),
])
async def test_a_sleepers_host_memory_is_its_report_only_within_the_room_made_for_it(
        reported, counted):
    settings = PoolSettings(sleep_host_memory_gb=1.0)
    async with serve(hostile({"host_bytes": reported})) as base, httpx.AsyncClient() as http:
        tier = SleepTier(settings, None, Capacity(settings), ReplicaEvents(EventLog(), Clock()),
                         http, Clock())
        managed = sleeping_replica(base)
        await tier.sleep(managed)
    assert managed.asleep is not None and managed.asleep.host_bytes == counted
