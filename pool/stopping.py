"""Stopping a replica: its last token counts read, its process stopped, and what it held
given back (pinned weights, slots), with its `stopped` event."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

import httpx

from pool.backends.base import Backend
from pool.capacity import Capacity
from pool.health import served_tokens
from pool.registry import ManagedReplica
from pool.replica import LIVE, ReplicaState
from pool.replica_events import ReplicaEvents
from pool.weights.store import WeightStore


@dataclass(frozen=True)
class ReplicaStopper:
    backend: Backend
    capacity: Capacity
    events: ReplicaEvents
    weights: WeightStore
    http: httpx.AsyncClient
    stop_timeout_s: float

    async def shutdown(self, managed: ManagedReplica, reason: Optional[str] = None) -> None:
        """Stop a live replica (starting, ready or draining) and record it stopped."""
        task = managed.task
        if task and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if managed.state is ReplicaState.READY:
            self.events.move(managed, ReplicaState.DRAINING, reason)
        if managed.handle is not None and managed.handle.is_alive():
            managed.final_tokens = await served_tokens(managed.handle, self.http)
        await self.cleanup(managed)
        if managed.state in LIVE:
            self.events.move(managed, ReplicaState.STOPPED, reason)

    async def cleanup(self, managed: ManagedReplica) -> None:
        """Give back what the replica holds: its process, its pinned weights, its slots."""
        handle = managed.handle
        if handle is not None:
            managed.stopping = True         # a Ray handle reads dead before its actor is gone
            try:
                await handle.stop(self.stop_timeout_s)
            finally:
                self.backend.forget(handle)
        for files in managed.files:
            self.weights.release(files)
        managed.files = ()
        placed, managed.placed = managed.placed, None
        if placed is not None:
            await self.capacity.release(managed.replica_id, placed.slot_ids)
