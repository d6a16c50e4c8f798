"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1 that records every
delivery and answers each path's scripted statuses in turn."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.controlplane.support.servers import serve

WAIT_S = 60.0          # a failsafe only: every wait ends on the event it waits for


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers each path's scripted statuses in turn, then 200; `hang` paths never answer."""
    script: dict[str, list[int]] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    base_url: str = ""                   # set once it is served

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        async with self.arrived:
            self.received.append(Received(path, dict(request.headers), await request.body()))
            self.arrived.notify_all()
        if path in self.hang:
            await self.released.wait()
        statuses = self.script.get(path, [])
        return Response(status_code=statuses.pop(0) if statuses else 200)

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    async def wait_for(self, path: str, count: int) -> list[Received]:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.at(path)) >= count),
                                   WAIT_S)
        return self.at(path)


@contextlib.asynccontextmanager
async def serving_receiver() -> AsyncIterator[Receiver]:
    """A Receiver behind a real server (its `base_url`), stopped with the block."""
    receiver = Receiver()
    app = Starlette(routes=[Route("/{path:path}", receiver.handle, methods=["POST"])])
    async with serve(app) as base_url:
        receiver.base_url = base_url
        yield receiver
        receiver.released.set()
