"""Replica events Postgres refuses for good, taken apart so that they stop no one else.

The pool offers its sink each replica event and heartbeat again and again, in order,
until it is taken (pool.replica_events): right for an outage, wrong for a value
Postgres will never take (a replica's counter past BIGINT, a reason with a NUL byte,
controlplane.store.failures.is_refusal). One such event would hold up the replica
lifetimes, and so the GPU bill, of every tenant behind it.

`DeadLetteringSink` wraps the Postgres sink: a refused item goes to the dead-letter
file with Postgres's reason, then what billing needs of it is written without the
replica's own words (an event without its reason and counters, a heartbeat without
its token counts), so the lifetime still opens, moves and closes. Should that be
refused too, the item is only dead-lettered; either way the queue goes on. An
outage still raises, and the pool retries as before.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Awaitable, Callable, TypeVar, Union

from controlplane.billing.outbox import DeadLetters
from controlplane.store.failures import is_refusal
from pool.api import Heartbeat, ReplicaEvent, ReplicaEventSink

log = logging.getLogger("thawpool.refusals")
REFUSED_REASON = "its reason was refused by postgres: see the replica-event dead letters"

Item = TypeVar("Item", ReplicaEvent, Heartbeat)


class DeadLetteringSink:
    """ReplicaEventSink: `sink`'s, with Postgres's refusals dead-lettered, never raised."""

    def __init__(self, sink: ReplicaEventSink, dead_letters: DeadLetters):
        self.sink = sink
        self.dead_letters = dead_letters

    async def replica_changed(self, event: ReplicaEvent) -> None:
        bare = dataclasses.replace(event, reason=REFUSED_REASON if event.reason else None,
                                   prompt_tokens=None, completion_tokens=None)
        await self._write(self.sink.replica_changed, event, bare)

    async def heartbeat(self, beat: Heartbeat) -> None:
        await self._write(self.sink.heartbeat, beat, dataclasses.replace(beat, tokens={}))

    async def _write(self, write: Callable[[Item], Awaitable[None]], item: Item, bare: Item) -> None:
        for attempt in (item, bare):
            try:
                await write(attempt)
                return
            except Exception as exc:
                if not is_refusal(exc):
                    raise                     # an outage: the pool offers it again
                self._dead_letter(attempt, exc)

    def _dead_letter(self, item: Union[ReplicaEvent, Heartbeat], exc: Exception) -> None:
        kind = "heartbeat" if isinstance(item, Heartbeat) else "replica_event"
        self.dead_letters.add_entries([{"kind": kind, "item": _plain(item)}], repr(exc)[:500])
        log.error("ALERT %s refused by postgres, moved to the dead-letter file", kind,
                  extra={"alert": "replica_event_dead_letter", "error": repr(exc)[:300],
                         "path": str(self.dead_letters.path)})


def _plain(item: Union[ReplicaEvent, Heartbeat]) -> Any:
    """The item as JSON values (times as ISO strings, tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(item), default=str))
