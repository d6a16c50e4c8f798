"""wire.disconnect.until_disconnect: the work's result, or None once the client left
(the work cancelled and unwound), and never a cancellation that leaks past it."""
import asyncio

import pytest

from wire.disconnect import until_disconnect

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Client:
    """ASGI's receive for a request whose body was read: it blocks until the client leaves."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def receive(self) -> dict:
        await self.left.wait()
        return {"type": "http.disconnect"}


async def long_work(unwound: list) -> str:
    """Work that would take 10 s; notes that it unwound."""
    try:
        await asyncio.sleep(10)
        return "too late"
    finally:
        unwound.append(True)


async def test_the_work_finishing_first_gives_its_result():
    client = Client()

    async def work() -> str:
        await asyncio.sleep(0.01)
        return "answer"
    assert await until_disconnect(client.receive, work()) == "answer"
    client.left.set()                      # a disconnect afterwards touches nothing
    await asyncio.sleep(0.02)
    assert asyncio.current_task().cancelling() == 0


async def test_a_client_that_leaves_first_cancels_the_work_and_it_unwinds():
    client, unwound = Client(), []

    asyncio.get_running_loop().call_later(0.02, client.left.set)
    assert await until_disconnect(client.receive, long_work(unwound)) is None
    assert unwound == [True]
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0.01)              # the caller goes on, not cancelled


async def test_work_that_swallows_the_cancellation_still_reads_as_the_client_gone():
    client = Client()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass
        return "swallowed"
    asyncio.get_running_loop().call_later(0.02, client.left.set)
    assert await until_disconnect(client.receive, stubborn()) is None
    assert asyncio.current_task().cancelling() == 0


async def test_the_callers_own_cancellation_goes_through():
    client = Client()

    async def caller() -> object:
        return await until_disconnect(client.receive, asyncio.sleep(10))
    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_disconnect_in_the_same_instant_as_the_result_does_not_cancel_later_awaits():
    client = Client()
    done = asyncio.get_running_loop().create_future()

    async def work() -> str:
        await done
        return "answer"

    async def caller() -> tuple[object, str]:
        result = await until_disconnect(client.receive, work())
        await asyncio.sleep(0.02)          # a stray cancel would land here
        return result, "went on"
    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0.01)
    done.set_result(None)                  # both in one loop iteration
    client.left.set()
    result, went_on = await task
    assert went_on == "went on" and result in ("answer", None)


async def test_work_done_before_watch_after_starts_no_watch():
    client, calls = Client(), []

    async def receive() -> dict:
        calls.append(True)
        return await client.receive()
    assert await until_disconnect(receive, asyncio.sleep(0, "quick"), watch_after_s=0.5) == "quick"
    await asyncio.sleep(0.01)
    assert calls == []                     # receive never called: no watch began


async def test_a_client_gone_before_watch_after_is_noticed_once_it_passes():
    client, unwound = Client(), []
    client.left.set()                      # gone from the start

    assert await until_disconnect(client.receive, long_work(unwound), watch_after_s=0.05) is None
    assert unwound == [True] and asyncio.current_task().cancelling() == 0
