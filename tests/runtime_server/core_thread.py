"""The engine core's step loop (`CoreLoop`) in a thread of the test's process, joined to a
real `EngineClient` by a pipe within this process: the same messages as between a server
and its engine-core process, without spawning one, over any engine (a real LLMEngine, or
a stand-in that fails on cue)."""
from __future__ import annotations

import multiprocessing
import os
import threading
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection
from typing import AsyncIterator, Optional

from runtime.serve.engine_client import EngineClient
from runtime.serve.engine_core import CoreLoop, Engine, EngineInfo, Loaded


class CoreThread:
    """engine_client.Core of a CoreLoop that runs in a thread; its sentinel (the read end
    of a pipe of its own) turns readable when the loop returns, as a process's does when
    it exits."""
    pid: Optional[int] = None   # no process of its own

    def __init__(self, engine: Engine, conn: Connection):
        self.exitcode: Optional[int] = None
        self._sentinel, self._exited = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(engine, conn),
                                        name="engine-core", daemon=True)
        self._thread.start()

    def _run(self, engine: Engine, conn: Connection) -> None:
        try:
            CoreLoop(engine, conn).run()
            self.exitcode = 0
        except BaseException:
            self.exitcode = 1
            raise
        finally:
            os.close(self._exited)

    @property
    def sentinel(self) -> int:
        return self._sentinel

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    def kill(self) -> None:
        """A thread cannot be killed; the pipe the client closed ends its loop."""

    def close(self) -> None:
        os.close(self._sentinel)


@asynccontextmanager
async def threaded_client(engine: Engine, info: EngineInfo) -> AsyncIterator[EngineClient]:
    """An EngineClient over `engine` stepped by a CoreLoop thread; stopped on the way out
    (after which the engine is the caller's again), and the core must never have died."""
    ours, theirs = multiprocessing.Pipe()
    core = CoreThread(engine, theirs)
    deaths: list[str] = []
    client = EngineClient(core, ours, Loaded(info, [], engine.stats()), on_death=deaths.append)
    try:
        yield client
    finally:
        await client.stop()
        core.close()
    assert deaths == [], deaths
