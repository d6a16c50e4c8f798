"""The activator queue: bounded, FIFO, timeouts and failures are explicit."""
import asyncio

import pytest

from pool.activator import RevisionQueue, Waiter, wait_for_replica
from pool.api import ColdStartFailed, ColdStartTimeout, QueueFull

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_full_queue_refuses_with_429():
    q = RevisionQueue("rev", limit=2)
    q.push(Waiter("a", 1, None, 0.0))
    q.push(Waiter("b", 1, None, 0.0))
    with pytest.raises(QueueFull) as err:
        q.push(Waiter("c", 1, None, 0.0))
    assert err.value.status == 429 and err.value.retry_after_s == 1.0   # push()'s default


async def test_dispatch_is_fifo_and_stops_when_no_replica():
    q = RevisionQueue("rev", limit=8)
    waiters = [Waiter(str(i), 10 * i, None, float(i)) for i in range(4)]
    for w in waiters:
        q.push(w)
    assert len(q) == 4 and q.prompt_tokens == 60 and q.oldest_mono() == 0.0
    capacity = iter(["r1", "r2", None])
    assert q.dispatch(lambda w: next(capacity)) == 2
    assert [w.future.result() for w in waiters[:2]] == ["r1", "r2"]
    assert not waiters[2].future.done() and len(q) == 2
    assert q.dispatch(lambda w: "r3") == 2 and len(q) == 0


async def test_wait_times_out_with_503_and_leaves_the_queue():
    q = RevisionQueue("rev", limit=8)
    w = Waiter("a", 1, None, 0.0)
    q.push(w)
    with pytest.raises(ColdStartTimeout) as err:
        await wait_for_replica(q, w, 0.01, on_lost=lambda rid: None, retry_after_s=7)
    assert err.value.status == 503 and err.value.retry_after_s == 7
    assert len(q) == 0


async def test_failure_reaches_every_waiter():
    q = RevisionQueue("rev", limit=8)
    waiters = [Waiter(str(i), 1, None, 0.0) for i in range(3)]
    for w in waiters:
        q.push(w)
    tasks = [asyncio.ensure_future(wait_for_replica(q, w, 5, on_lost=lambda rid: None)) for w in waiters]
    await asyncio.sleep(0)
    assert q.fail_all(ColdStartFailed("missing object s3://b/m/model.safetensors")) == 3
    for t in tasks:
        with pytest.raises(ColdStartFailed, match="missing object"):
            await t


async def test_cancelled_after_assignment_gives_the_replica_back():
    q = RevisionQueue("rev", limit=8)
    w = Waiter("a", 1, None, 0.0)
    q.push(w)
    lost = []
    task = asyncio.ensure_future(wait_for_replica(q, w, 5, on_lost=lost.append))
    await asyncio.sleep(0)
    q.dispatch(lambda _: "r1")
    task.cancel()
    try:
        got = await task                 # the caller kept the replica...
        assert got == "r1" and lost == []
    except asyncio.CancelledError:       # ...or it was handed back: never leaked
        assert lost == ["r1"]


async def test_cancelled_before_assignment_leaves_the_queue():
    q = RevisionQueue("rev", limit=8)
    w = Waiter("a", 1, None, 0.0)
    q.push(w)
    task = asyncio.ensure_future(wait_for_replica(q, w, 5, on_lost=lambda rid: None))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(q) == 0 and q.dispatch(lambda _: "r1") == 0
