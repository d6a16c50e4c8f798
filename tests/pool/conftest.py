"""Pool test helpers: settings pointed at the session S3, an aiobotocore client."""
from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from pool.settings import PoolSettings


def make_settings(s3_server, tmp_path, **overrides) -> PoolSettings:
    env = s3_server.env()
    base = dict(accelerator="cpu", cache_dir=tmp_path / "cache", s3_endpoint=env["THAWPOOL_S3_ENDPOINT"],
                aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], s3_backoff_base_s=0.01,
                s3_backoff_cap_s=0.05)
    base.update(overrides)
    return PoolSettings(**base)


@pytest.fixture
def settings(s3_server, tmp_path) -> PoolSettings:
    return make_settings(s3_server, tmp_path)


@pytest.fixture
async def s3(settings):
    from pool.s3 import open_client

    async with AsyncExitStack() as stack:
        yield await open_client(settings, stack)


class FlakyS3:
    """A thin wrapper that injects faults SeaweedFS cannot produce on demand.

    throttle: the first N get_object calls raise SlowDown (503), like S3 throttling.
    deny_call: the k-th get_object call (1-based) raises AccessDenied (not retried).
    """

    def __init__(self, client, throttle: int = 0, deny_call: int | None = None):
        self._client = client
        self.throttle = throttle
        self.deny_call = deny_call
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def get_object(self, **kwargs):
        from botocore.exceptions import ClientError

        self.calls += 1
        if self.calls <= self.throttle:
            raise ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                               "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
        if self.deny_call is not None and self.calls == self.deny_call:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
        return await self._client.get_object(**kwargs)


@pytest.fixture(scope="session")
def pool_bucket(s3_server) -> str:
    """One bucket for all pool tests (SeaweedFS grows 7 volumes per bucket, and the
    session server has 64): each test writes under its own prefix (`fresh_prefix`)."""
    name = "pool-tests"
    s3_server.ensure_bucket(name)
    return name


@pytest.fixture
def fresh_prefix() -> str:
    import uuid

    return f"t{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def running_manager(settings: PoolSettings, events=None):
    """A PoolManager over an in-memory desired state and the session S3, on a clock the test
    steps, its replica events into `events` (an EventLog) when given; stopped on the way out."""
    from pool.in_memory import EventLog, InMemoryDesiredState
    from pool.manager import PoolManager
    from pool.s3 import open_client
    from tests.support.clock import SteppedClock

    desired = InMemoryDesiredState()
    async with AsyncExitStack() as stack:
        manager = PoolManager(settings, desired, events if events is not None else EventLog(),
                              s3_client=await open_client(settings, stack),
                              clock=SteppedClock())
        try:
            await manager.start()
            yield manager, desired
        finally:
            await manager.stop()
