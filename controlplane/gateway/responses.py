"""The OpenAI Responses API over the chat gateway: a turn is prepared (parsed, the
conversation `previous_response_id` continues read back), served as a chat completion by
the same steps as /v1/chat/completions (controlplane.gateway.llm: resolve, validate, admit,
acquire, send, relay, meter; the usage row's endpoint is `responses`), and answered in
the Responses API's shape (`ResponseShape`), which stores the response, when `store`
asks it to, before the client sees it complete: the next turn can always find it.

Stored responses belong to their tenant (another's id is not found), expire after
`settings.response_retention_s` (unreadable at once, deleted by `sweep`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Optional

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.errors import ApiError
from controlplane.gateway.llm import Gateway, Invocation, RouteTarget
from controlplane.gateway.openai_wire import UsageSeen
from controlplane.gateway.response_retention import Retention
from controlplane.store import responses as store
from controlplane.store.tables import utcnow
from controlplane.store.tenants import Principal
from wire.errors import ProtocolError
from wire.responses_output import (ResponseEvents, ResponseHead, conversation_of, output_of, status_of,
                                   usage_of)
from wire.responses_request import Message, ResponsesRequest, parse_responses_request, renamed
from wire.sse import sse

log = logging.getLogger("thawpool.responses")


@dataclass(frozen=True)
class Turn:
    """One Responses call, ready to serve: the request, the chat body that serves it, and
    the conversation it answers (what a later turn continues; no instructions)."""
    request: ResponsesRequest
    chat: dict[str, Any]
    conversation: list[Message]


class Responses:
    def __init__(self, gateway: Gateway, sessions: async_sessionmaker[AsyncSession], retention: Retention,
                 clock: Callable[[], datetime] = utcnow):
        self.gateway = gateway
        self.sessions = sessions
        self.retention = retention
        self.clock = clock

    async def prepare(self, principal: Principal, body: Any) -> Turn:
        """The request parsed (400 naming the field), and the earlier turns read back when
        it continues one (404 when the tenant has no such response)."""
        request = parse_responses_request(body)
        history: list[Message] = []
        if request.previous_response_id is not None:
            previous = await self.find(principal, request.previous_response_id, param="previous_response_id")
            history = [*previous.conversation, *conversation_of(previous.response["output"])]
        conversation = [*history, *request.messages]
        return Turn(request, request.chat_body(history), conversation)

    def validate(self, turn: Turn, target: RouteTarget) -> Invocation:
        """The chat rules over the translated body, refusals named as the client named them."""
        try:
            return self.gateway.validate("chat/completions", turn.chat, target)
        except ProtocolError as exc:
            raise renamed(exc) from None

    def shape(self, principal: Principal, target: RouteTarget, turn: Turn) -> "ResponseShape":
        head = ResponseHead(target.model_name, turn.request.echo)

        async def keep(response: dict[str, Any]) -> None:
            if turn.request.store:
                await self.add(principal, target.model_name, turn.conversation, response)

        return ResponseShape(head, keep)

    async def add(self, principal: Principal, model: str, conversation: list[Message],
                  response: dict[str, Any]) -> None:
        async with self.sessions.begin() as session:
            await store.add(session, store.Stored(response["id"], principal.tenant_id, model, conversation,
                                                  response, self.clock()))

    async def find(self, principal: Principal, response_id: str, param: Optional[str] = None) -> store.Stored:
        """The caller tenant's unexpired response; 404 for any other (another tenant's too)."""
        async with self.sessions() as session:
            found = await store.find(session, principal.tenant_id, response_id,
                                     self.retention.cutoff(self.clock()))
        if found is None:
            raise not_found(response_id, param)
        return found

    async def delete(self, principal: Principal, response_id: str) -> None:
        """Deletes the caller tenant's unexpired response; 404 for any other."""
        async with self.sessions.begin() as session:
            deleted = await store.remove(session, principal.tenant_id, response_id,
                                         self.retention.cutoff(self.clock()))
        if not deleted:
            raise not_found(response_id)

    async def sweep(self) -> int:
        """Deletes every expired response, a batch per transaction; how many."""
        total = 0
        while True:
            async with self.sessions.begin() as session:
                deleted = await store.delete_expired(session, self.retention.cutoff(self.clock()),
                                                     self.retention.batch)
            total += deleted
            if not self.retention.sweep_again(deleted):
                return total


class ResponseShape:
    """The replica's chat answer as a Responses API answer (controlplane.gateway.answer_shape):
    a response object, or its typed events; `keep` stores the finished response."""

    def __init__(self, head: ResponseHead, keep: Callable[[dict[str, Any]], Awaitable[None]]):
        self.head = head
        self.keep = keep
        self.events = ResponseEvents(head)

    async def whole(self, payload: dict[str, Any], usage: UsageSeen) -> dict[str, Any]:
        output, finish_reason = output_of(payload)
        response = self.head.body(status_of(finish_reason), output, _usage(usage))
        await self.keep(response)
        return response

    def opening(self) -> list[bytes]:
        return [event_frame(e) for e in self.events.opening()]

    def frames(self, payload: dict[str, Any]) -> list[bytes]:
        return [event_frame(e) for e in self.events.chunk(payload)]

    async def closing(self, usage: UsageSeen) -> list[bytes]:
        events, response = self.events.closing(_usage(usage))
        await self.keep(response)
        return [event_frame(e) for e in events]

    def failure(self, body: dict[str, Any]) -> bytes:
        return event_frame(self.events.error(body))


def not_found(response_id: str, param: Optional[str] = None) -> ApiError:
    """The same answer for an unknown, expired or another tenant's id."""
    where = f"{param}: " if param else ""
    return ApiError(404, f"{where}no response {response_id!r}", code="response_not_found", param=param)


def event_frame(event: dict[str, Any]) -> bytes:
    """One typed event as OpenAI frames it: its type as the SSE event name, then its data."""
    return b"event: " + str(event["type"]).encode() + b"\n" + sse(event)


def _usage(usage: UsageSeen) -> dict[str, Any]:
    return usage_of(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
