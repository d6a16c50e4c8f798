"""Batches as OpenAI defines them: create (its input file validated line by line with
the gateway's own rules), retrieve, list and cancel. The lines are run by
controlplane.batch.runner.

At create, each line is checked as a call would be at the edge: JSON, custom_id unique,
method POST, url the batch's endpoint (controlplane.batch.input_lines), then the
deployment its `model` names exists and is the caller's (or shared), and the body
passes the gateway's validation (wire.requests.parse_request and what needs the model).
A bad line becomes that line's error-file line and the others run; a file that is not
JSONL is refused whole (NotJsonl, 400). The batch and every line are committed in one
transaction before the client hears of the batch.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional, Union

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.batch.files import BatchFiles
from controlplane.batch.input_lines import (ENDPOINTS, BadLine, InputLine, NotJsonl, gateway_path,
                                            invalid, parse_lines)
from controlplane.batch.results import CANCELLED, FAILED, RequestCounts, error_line, request_counts
from controlplane.errors import REFUSALS, api_error_for
from controlplane.gateway.llm import Gateway
from controlplane.store import batches as store
from controlplane.store.errors import Conflict
from controlplane.store.tables import Batch, utcnow
from controlplane.store.tenants import Principal
from wire.errors import ProtocolError

WINDOWS = {"24h": timedelta(hours=24)}
MAX_METADATA = 16


@dataclass(frozen=True)
class BatchView:
    batch: Batch
    counts: RequestCounts


class Batches:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], files: BatchFiles,
                 gateway: Gateway, max_lines: int):
        self.sessions, self.files, self.gateway, self.max_lines = sessions, files, gateway, max_lines

    async def create(self, principal: Principal, body: Any) -> BatchView:
        """`{input_file_id, endpoint, completion_window, metadata?}` -> the batch, in progress."""
        endpoint, window, metadata, file_id = _parse_create(body)
        source = await self.files.get(principal.tenant_id, file_id)
        if source.purpose != "batch":
            raise invalid("input_file_id", "must name a file of purpose \"batch\"")
        try:
            parsed = parse_lines(await self.files.read(source), endpoint, self.max_lines)
        except NotJsonl as exc:
            raise ProtocolError(f"input_file_id: {exc}", param="input_file_id",
                                code="invalid_file") from None
        now = utcnow()
        batch = Batch(id=f"batch_{uuid.uuid4().hex}", tenant_id=principal.tenant_id,
                      api_key_id=principal.key_id, endpoint=endpoint, input_file_id=file_id,
                      completion_window=window, status="in_progress", batch_metadata=metadata,
                      total=len(parsed), created_at=now, expires_at=now + WINDOWS[window])
        lines = [await self._line(principal, batch, p) for p in parsed]
        async with self.sessions.begin() as session:
            await store.add_batch(session, batch, lines)
        counts = request_counts(len(lines), {FAILED: sum(1 for x in lines if x["status"] == FAILED)})
        return BatchView(batch, counts)

    async def _line(self, principal: Principal, batch: Batch,
                    parsed: Union[InputLine, BadLine]) -> dict[str, Any]:
        if isinstance(parsed, InputLine):
            refusal = await self._refusal(principal, batch, parsed)
            if refusal is None:
                return {"batch_id": batch.id, "line": parsed.line, "custom_id": parsed.custom_id,
                        "model": parsed.body["model"], "body": json.dumps(parsed.body),
                        "status": "pending", "attempts": 0}
            parsed = refusal
        return {"batch_id": batch.id, "line": parsed.line, "custom_id": parsed.custom_id,
                "model": None, "body": None, "status": FAILED, "attempts": 0,
                "result": error_line(batch.id, parsed.line, parsed.custom_id, parsed.code,
                                     parsed.message)}

    async def _refusal(self, principal: Principal, batch: Batch, line: InputLine) -> Optional[BadLine]:
        """What the gateway would refuse this request for, now; None: it would take it."""
        try:
            target = await self.gateway.resolve(principal, line.body, f"{batch.id}-{line.line}")
            self.gateway.validate(gateway_path(batch.endpoint), line.body, target)
        except REFUSALS as exc:
            refused = api_error_for(exc)
            return BadLine(line.line, line.custom_id, refused.code or "invalid_request",
                           f"line {line.line + 1}: {refused.message}")
        return None

    async def get(self, tenant_id: str, batch_id: str) -> BatchView:
        async with self.sessions() as session:
            batch = await store.find_batch(session, tenant_id, batch_id)
            counts = await store.line_counts(session, [batch.id])
        return BatchView(batch, request_counts(batch.total, counts[batch.id]))

    async def list(self, tenant_id: str, limit: int, after: Optional[str]) -> list[BatchView]:
        async with self.sessions() as session:
            cursor = await store.find_batch(session, tenant_id, after) if after else None
            batches = await store.list_batches(session, tenant_id, limit, cursor)
            counts = await store.line_counts(session, [b.id for b in batches])
        return [BatchView(b, request_counts(b.total, counts[b.id])) for b in batches]

    async def cancel(self, tenant_id: str, batch_id: str) -> BatchView:
        """In progress -> cancelling: lines not started never run; the runner ends the
        batch `cancelled` once the running ones have ended, their answers kept."""
        async with self.sessions.begin() as session:
            batch = await store.find_batch(session, tenant_id, batch_id, for_update=True)
            if batch.status not in ("in_progress", "cancelling"):
                raise Conflict("batch_not_cancellable", f"batch {batch_id} is {batch.status}")
            if batch.status == "in_progress":
                batch.status, batch.cancelling_at = "cancelling", utcnow()
                await store.end_pending(session, batch.id, CANCELLED)
        return await self.get(tenant_id, batch_id)


def _parse_create(body: Any) -> tuple[str, str, Optional[dict[str, str]], str]:
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
    if not isinstance(file_id, str) or not file_id:
        raise invalid("input_file_id", "is required")
    if endpoint not in ENDPOINTS:
        raise invalid("endpoint", f"must be one of {', '.join(ENDPOINTS)}")
    window = body.get("completion_window")
    if window not in WINDOWS:
        raise invalid("completion_window", f"must be one of {', '.join(WINDOWS)}")
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= MAX_METADATA
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise invalid("metadata", f"at most {MAX_METADATA} string keys with string values")
    return endpoint, window, metadata, file_id
