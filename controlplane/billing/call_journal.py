"""The journal of calls in flight: what each call has delivered so far, kept where a killed
control plane's successor finds it, so a call cut by the control plane's own death is
billed what its client received (B-CP-3 in docs/billing-guarantees.md).

The gateway writes three kinds of frame (outbox.frame: length and checksum per line),
each with one write() and no fsync (a killed process loses nothing the kernel has; a
lost machine loses the page cache, as the usage journal does):

  open      once a call's request is on its way to its replica (written while the
            replica works; nothing of the answer can have reached the client yet): the
            usage row it would get if it delivered nothing, and its admitted price
  progress  after each chunk of a stream was handed to the client's connection (one
            loop turn after its send, once the event loop has put it into the kernel):
            the cumulative usage delivered, the time, and whether it was the final [DONE]
  close     once the call is metered (its real row is in the usage journal)

At the next start `recover` turns every call opened and never closed into a `partial`
row of what its last progress frame says was delivered (`error` with 0 tokens when
nothing was; `ok` when [DONE] went out), marked `recovered`. It keeps the invocation id of the row the call would
have had, so a row that did land before the kill wins (usage rows are keyed by it).

Segments roll over at `segment_bytes`; a rolled segment is deleted once every call
opened in it is closed, so the journal holds about one segment plus long calls.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

from controlplane.billing.outbox import frame, leftover_segments, open_segment, unframe
from controlplane.billing.pricing import PRICE_FIELDS, Pricing, invocation_cost
from controlplane.billing.usage import UsageRecord

log = logging.getLogger("thawpool.call_journal")

SEGMENT_BYTES = 4 << 20
CUT_HTTP_STATUS = 502      # the client's connection closed without an end, as an upstream cut


@dataclass(frozen=True)
class Delivered:
    """Cumulative usage a call has handed to its client."""
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: Optional[float]
    at: float                   # epoch seconds
    done: bool = False          # [DONE] went out: the whole answer


@dataclass
class _Open:
    record: UsageRecord
    pricing: Pricing
    delivered: Optional[Delivered] = None


class CallJournal:
    PATTERN = "calls-journal-*.log"

    def __init__(self, directory: Path | str, segment_bytes: int = SEGMENT_BYTES):
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._fd: Optional[int] = None
        self._path: Optional[Path] = None
        self._written = 0
        self._opened_in: dict[str, Path] = {}      # invocation id -> its open frame's segment
        self._live: Counter[Path] = Counter()      # calls open per segment
        self._rolled: set[Path] = set()
        self._warned = False

    # ---------------------------------------------------------------- writing

    def open(self, record: UsageRecord, pricing: Pricing) -> None:
        if self._fd is not None and self._written >= self.segment_bytes:
            self._roll()
        prices = json.dumps({name: str(getattr(pricing, name)) for name in PRICE_FIELDS},
                            separators=(",", ":"))
        payload = f'{{"open":{record.to_json()},"pricing":{prices}}}'.encode()   # no re-parse per call
        if self._write(payload) and self._path is not None:
            self._opened_in[record.invocation_id] = self._path
            self._live[self._path] += 1

    def progress(self, invocation_id: str, delivered: Delivered) -> None:
        ttft = "null" if delivered.ttft_s is None else f"{delivered.ttft_s:.6f}"
        self._write(b'{"progress":"%s","usage":[%d,%d,%d],"ttft_s":%s,"at":%.6f,"done":%s}' % (
            invocation_id.encode(), delivered.prompt_tokens, delivered.cached_tokens,
            delivered.completion_tokens, ttft.encode(), delivered.at,
            b"true" if delivered.done else b"false"))

    def progress_after_flush(self, invocation_id: str, delivered: Delivered) -> None:
        """`progress`, one turn of the event loop later: uvloop queues a small write and
        hands it to the kernel only at the end of the loop's turn, so a frame written at
        once could bill a chunk that a kill left inside the process. A frame landing after
        the call's close is harmless: recovery skips closed calls."""
        asyncio.get_running_loop().call_soon(self.progress, invocation_id, delivered)

    def close(self, invocation_id: str) -> None:
        self._write(b'{"close":"%s"}' % invocation_id.encode())
        segment = self._opened_in.pop(invocation_id, None)
        if segment is None:
            return
        self._live[segment] -= 1
        if self._live[segment] <= 0:
            del self._live[segment]
            if segment in self._rolled:
                self._forget(segment)

    def _write(self, payload: bytes) -> bool:
        """Never raises: a journal that cannot be written only loses the crash guarantee."""
        try:
            if self._fd is None:
                self._path, self._fd = open_segment(self.directory, self.PATTERN)
                self._written = 0
            line = frame(payload)
            os.write(self._fd, line)
            self._written += len(line)
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("call journal not written: a call cut by a crash would go unbilled",
                            extra={"error": repr(exc)[:300]})
            return False

    def _roll(self) -> None:
        assert self._fd is not None and self._path is not None
        os.close(self._fd)
        done, self._fd, self._path = self._path, None, None
        if self._live[done] > 0:
            self._rolled.add(done)
        else:
            self._live.pop(done, None)
            done.unlink(missing_ok=True)

    def _forget(self, segment: Path) -> None:
        self._rolled.discard(segment)
        segment.unlink(missing_ok=True)

    def shut(self) -> None:
        """A clean stop: segments with no call open are deleted."""
        if self._fd is not None and self._path is not None:
            os.close(self._fd)
            if self._live[self._path] <= 0:
                self._path.unlink(missing_ok=True)
            self._fd = self._path = None
        for segment in list(self._rolled):
            if self._live[segment] <= 0:
                self._forget(segment)

    # ---------------------------------------------------------------- recovery

    def leftovers(self) -> list[Path]:
        """Segments an earlier process left (not this one's)."""
        return leftover_segments(self.directory, self.PATTERN, {self._path, *self._rolled})


def recover(segments: list[Path]) -> tuple[list[UsageRecord], int]:
    """The rows of the calls opened and never closed in `segments`, and how many lines
    failed their check (a torn last line is expected after a kill)."""
    calls: dict[str, _Open] = {}
    closed: set[str] = set()
    corrupt = 0
    for segment in segments:
        for line in segment.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            payload = unframe(line)
            try:
                if payload is None:
                    raise ValueError("length or checksum does not match")
                _apply(json.loads(payload), calls, closed)
            except (ValueError, TypeError, KeyError):
                corrupt += 1
    rows = [_cut_row(call) for inv, call in calls.items() if inv not in closed]
    return rows, corrupt


def _apply(entry: dict[str, Any], calls: dict[str, _Open], closed: set[str]) -> None:
    if "open" in entry:
        record = UsageRecord.from_json(json.dumps(entry["open"]))
        pricing = Pricing(**{name: Decimal(entry["pricing"][name]) for name in PRICE_FIELDS})
        calls[record.invocation_id] = _Open(record, pricing)
    elif "progress" in entry:
        call = calls.get(entry["progress"])
        if call is not None:
            prompt, cached, completion = (int(n) for n in entry["usage"])
            ttft = entry["ttft_s"]
            call.delivered = Delivered(prompt, cached, completion, None if ttft is None else float(ttft),
                                       float(entry["at"]), bool(entry["done"]))
    elif "close" in entry:
        closed.add(str(entry["close"]))
    else:
        raise ValueError("unknown call journal entry")


def _cut_row(call: _Open) -> UsageRecord:
    """The row of a call cut by the control plane's death: what it delivered."""
    record, seen = call.record, call.delivered
    if seen is None:
        seen = Delivered(0, 0, 0, None, record.started_at.timestamp())
    delivered = seen.completion_tokens > 0
    status, http_status = (("ok", 200) if seen.done else
                           ("partial" if delivered else "error", CUT_HTTP_STATUS))
    finished_at = datetime.fromtimestamp(seen.at, timezone.utc)
    return replace(
        record, status=status, http_status=http_status,
        prompt_tokens=seen.prompt_tokens, cached_tokens=seen.cached_tokens,
        completion_tokens=seen.completion_tokens, ttft_s=seen.ttft_s,
        total_s=max(0.0, (finished_at - record.started_at).total_seconds()),
        cost=invocation_cost(call.pricing, seen.prompt_tokens, seen.cached_tokens,
                             seen.completion_tokens, charge_call=status != "error"),
        finished_at=finished_at, recovered=True)
