"""S3 as production serves it: each connection capped (tests/support/throttle_proxy.py).

The pacing arithmetic is checked with plain numbers for the time; the proxy in front
of the session's SeaweedFS is checked for the cap (a lower bound on time only: a busy
machine can make anything slower, never faster), for the first-byte latency, and for
the pool's parallel ranged download arriving whole over several capped connections.
"""
from __future__ import annotations

import hashlib
import os
import socket
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from pool.s3 import open_client
from pool.weights.cache import WeightCache
from pool.weights.store import WeightStore
from tests.pool.conftest import make_settings
from tests.support.model_factory import upload_model
from tests.support.pacing import TokenBucket
from tests.support.throttle_process import ProxyProcess
from tests.support.throttle_proxy import READ_SIZE, ThrottleProxy, through
from tests.support.waiting import eventually_sync

MB = 1024 * 1024


# -- pacing, no server and no clock --------------------------------------------------

def test_the_first_burst_goes_at_once_then_bytes_wait_their_time_at_the_rate():
    bucket = TokenBucket(rate_bytes_per_s=100, burst_bytes=10, now=0.0)
    assert bucket.reserve(10, now=0.0) == 0.0
    assert bucket.reserve(50, now=0.0) == pytest.approx(0.5)
    # the sender waited its 0.5 s and sent; the next 20 bytes are 0.2 s more
    assert bucket.reserve(20, now=0.5) == pytest.approx(0.2)


def test_a_chunk_larger_than_the_burst_passes_at_the_rate():
    bucket = TokenBucket(rate_bytes_per_s=1000, burst_bytes=100, now=0.0)
    assert bucket.reserve(1100, now=0.0) == pytest.approx(1.0)


def test_idle_time_refills_only_up_to_the_burst():
    bucket = TokenBucket(rate_bytes_per_s=100, burst_bytes=10, now=0.0)
    bucket.reserve(10, now=0.0)
    assert bucket.reserve(10, now=60.0) == 0.0             # a minute idle: 10 tokens, not 6000
    assert bucket.reserve(100, now=60.0) == pytest.approx(1.0)


def test_a_sender_that_waits_as_told_sends_at_exactly_the_rate():
    bucket = TokenBucket(rate_bytes_per_s=80 * MB, burst_bytes=READ_SIZE, now=5.0)
    now, sent = 5.0, 0
    for size in [READ_SIZE, 1000, 65536, READ_SIZE, 7, 300_000] * 50:
        now += bucket.reserve(size, now)
        sent += size
    assert now - 5.0 == pytest.approx((sent - READ_SIZE) / (80 * MB))


def test_a_clock_that_steps_back_refills_nothing():
    bucket = TokenBucket(rate_bytes_per_s=100, burst_bytes=0, now=10.0)
    assert bucket.reserve(100, now=10.0) == pytest.approx(1.0)
    assert bucket.reserve(100, now=9.0) == pytest.approx(2.0)    # from 10.0: 200 bytes owed


def test_a_rate_must_be_positive():
    with pytest.raises(ValueError):
        TokenBucket(rate_bytes_per_s=0, burst_bytes=10, now=0.0)


# -- the proxy in front of SeaweedFS ---------------------------------------------------

def test_one_stream_is_capped_at_the_rate(s3_server, pool_bucket, fresh_prefix):
    data = os.urandom(16 * MB)
    s3_server.client().put_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/blob", Body=data)
    with ThrottleProxy(s3_server.port, rate_bytes_per_s=40 * MB) as proxy:
        client = through(proxy, s3_server).client()
        started = time.monotonic()
        got = client.get_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/blob")["Body"].read()
        seconds = time.monotonic() - started
    assert got == data
    assert proxy.stats.connections == 1 and proxy.stats.bytes_down > len(data)
    # (16 MB - one read of burst) / 40 MB/s is 0.39 s; unthrottled loopback takes ~0.05 s
    assert seconds >= 0.3


def test_every_answer_waits_the_first_byte_latency(s3_server, pool_bucket, fresh_prefix):
    key = f"{fresh_prefix}/small"
    s3_server.client().put_object(Bucket=pool_bucket, Key=key, Body=b"x" * 100)
    with ThrottleProxy(s3_server.port, rate_bytes_per_s=40 * MB, first_byte_latency_s=0.25) as proxy:
        client = through(proxy, s3_server).client()
        started = time.monotonic()
        for _ in range(2):                     # two requests on one kept-alive connection
            assert client.get_object(Bucket=pool_bucket, Key=key)["Body"].read() == b"x" * 100
        seconds = time.monotonic() - started
    assert proxy.stats.connections == 1
    assert seconds >= 0.5


def test_the_proxy_in_a_process_of_its_own_reports_what_it_carried(s3_server, pool_bucket, fresh_prefix):
    data = os.urandom(MB)
    s3_server.client().put_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/blob", Body=data)
    with ProxyProcess(s3_server.port, rate_bytes_per_s=40 * MB) as proxy:
        assert through(proxy, s3_server).client().get_object(
            Bucket=pool_bucket, Key=f"{fresh_prefix}/blob")["Body"].read() == data
    assert proxy.process is None
    assert proxy.stats.connections == 1 and proxy.stats.bytes_down > len(data)


def test_stop_ends_open_connections(s3_server):
    proxy = ThrottleProxy(s3_server.port, rate_bytes_per_s=40 * MB).start()
    idle = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    try:
        eventually_sync(lambda: proxy.stats.open == 1, timeout_s=10, what="the proxy to accept")
        proxy.stop()
        assert proxy.stats.open == 0
        assert idle.recv(1) == b""             # the client sees the connection end
    finally:
        proxy.stop()
        idle.close()


def write_model(folder: Path) -> Path:
    """A model folder as the store sees one (it never parses the weights): random bytes."""
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (folder / "tokenizer.json").write_bytes(os.urandom(300_000))
    (folder / "model.safetensors").write_bytes(os.urandom(6 * MB))
    return folder


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_pool_download_arrives_whole_over_several_capped_connections(
        s3_server, pool_bucket, fresh_prefix, tmp_path):
    model = write_model(tmp_path / "model")
    uri = upload_model(model, s3_server.client(), pool_bucket, f"{fresh_prefix}/model")
    with ThrottleProxy(s3_server.port, rate_bytes_per_s=20 * MB) as proxy:
        settings = make_settings(through(proxy, s3_server), tmp_path, part_size_mb=1.0,
                                 download_concurrency=4)
        async with AsyncExitStack() as stack:
            store = WeightStore(await open_client(settings, stack),
                                WeightCache(settings.cache_dir, settings.cache_budget_bytes), settings)
            files = await store.fetch_model(uri)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert sha256(files.model_dir / name) == sha256(model / name)
    total = sum(f.stat().st_size for f in model.iterdir())
    assert files.downloaded_bytes == total and proxy.stats.bytes_down > total
    assert proxy.stats.peak_open > 1           # the parts came over connections at once
