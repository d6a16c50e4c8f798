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


async def test_waiters_are_dispatched_by_priority_then_arrival():
    q = RevisionQueue("rev", limit=8)
    for rid, priority in [("b1", 100), ("i1", 0), ("b2", 100), ("i2", 0), ("x", -1)]:
        q.push(Waiter(rid, 1, None, 0.0, priority))
    served: list[str] = []
    q.dispatch(lambda w: served.append(w.request_id) or "r1")
    assert served == ["x", "i1", "i2", "b1", "b2"]


async def test_a_full_queue_sheds_its_worst_waiter_for_a_better_newcomer():
    q = RevisionQueue("rev", limit=3)
    b1, b2, i1 = Waiter("b1", 1, None, 0.0, 100), Waiter("b2", 1, None, 0.0, 100), Waiter("i1", 1, None, 0.0, 0)
    for w in (b1, b2, i1):
        q.push(w)
    i2 = Waiter("i2", 1, None, 0.0, 0)
    q.push(i2, retry_after_s=3.0)                  # b2: the worst class, the later of it
    with pytest.raises(QueueFull, match="shed from a full queue") as err:
        await wait_for_replica(q, b2, 5, on_lost=lambda rid: None)
    assert err.value.status == 429 and err.value.retry_after_s == 3.0
    assert [w.request_id for w in q] == ["i1", "i2", "b1"]
    with pytest.raises(QueueFull, match="3 requests already wait"):
        q.push(Waiter("b3", 1, None, 0.0, 100))    # outranks nobody: refused itself
    q.push(Waiter("i3", 1, None, 0.0, 0))          # b1 is shed for it
    assert isinstance(b1.future.exception(), QueueFull)
    assert [w.request_id for w in q] == ["i1", "i2", "i3"]
