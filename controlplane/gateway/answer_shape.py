"""How a replica's chat answer reaches the client: as chat completions (its own shape), or
as another API's objects and events over the same answer (controlplane.gateway.responses).

The gateway reads, meters and relays the replica's answer the same way whatever the
shape; the shape only rewrites what the client is sent. A shape's `whole` and `closing`
may do I/O (the Responses API stores its answer before the client sees it complete).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.gateway.openai_wire import UsageSeen, client_chunk, client_response
from wire.requests import StreamOptions
from wire.sse import SSE_DONE, sse


class AnswerShape(Protocol):
    async def whole(self, payload: dict[str, Any], usage: UsageSeen) -> dict[str, Any]:
        """A unary answer the replica gave with 200, for the client; `usage` is what is billed."""

    def opening(self) -> list[bytes]:
        """The events a stream starts with, before the replica's first chunk."""

    def frames(self, payload: dict[str, Any]) -> list[bytes]:
        """One replica chunk (its usage already observed) as the client's events; [] drops it."""

    async def closing(self, usage: UsageSeen) -> list[bytes]:
        """The events after the replica's last chunk ([DONE]); `usage` is what is billed."""

    def failure(self, body: dict[str, Any]) -> bytes:
        """The event telling the client the stream broke off, `body` in the error shape."""


@dataclass(frozen=True)
class ChatShape:
    """Chat and text completions as the client asked for them: the deployment's name as
    `model`, usage as its stream_options say."""
    model: str
    options: StreamOptions = StreamOptions()

    async def whole(self, payload: dict[str, Any], usage: UsageSeen) -> dict[str, Any]:
        return client_response(payload, self.model)

    def opening(self) -> list[bytes]:
        return []

    def frames(self, payload: dict[str, Any]) -> list[bytes]:
        chunk = client_chunk(payload, self.model, self.options)
        return [] if chunk is None else [sse(chunk)]

    async def closing(self, usage: UsageSeen) -> list[bytes]:
        return [SSE_DONE]

    def failure(self, body: dict[str, Any]) -> bytes:
        return sse(body)
