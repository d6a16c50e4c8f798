"""controlplane.billing.call_journal: the calls a killed control plane was serving are billed at
the next start for what their clients were delivered, and nothing else is."""
from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import uvloop

from controlplane.billing.call_journal import CallJournal, Delivered, recover
from controlplane.billing.pricing import Pricing, invocation_cost
from tests.controlplane.support.usage import make_record

PRICES = Pricing(input_per_mtok=Decimal("1.5"), cached_input_per_mtok=Decimal("0.5"),
                 output_per_mtok=Decimal("6"), per_call=Decimal("0.0001"))


def opened(journal: CallJournal, **kw):
    """A call as the gateway opens it: the row it would get had it delivered nothing."""
    record = replace(make_record(prompt_tokens=0, completion_tokens=0, cost=Decimal(0), **kw),
                     status="error", http_status=502)
    journal.open(record, PRICES)
    return record


def delivered(completion: int, done: bool = False) -> Delivered:
    return Delivered(12, 4, completion, 0.05, time.time(), done=done)


def left_by(journal: CallJournal, directory: Path):
    """What the next process finds: the segments this one left, read by a fresh journal."""
    segments = CallJournal(directory).leftovers()
    assert segments == sorted(directory.glob(CallJournal.PATTERN))
    return recover(segments)


def test_a_cut_stream_is_billed_what_its_last_progress_says_was_delivered(tmp_path):
    journal = CallJournal(tmp_path)
    cut = opened(journal)
    for n in (1, 2, 3):
        journal.progress(cut.invocation_id, delivered(n))
    rows, corrupt = left_by(journal, tmp_path)
    assert corrupt == 0
    (row,) = rows
    assert (row.invocation_id, row.request_id) == (cut.invocation_id, cut.request_id)
    assert (row.status, row.http_status, row.recovered) == ("partial", 502, True)
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (12, 4, 3)
    assert row.cost == invocation_cost(PRICES, 12, 4, 3, charge_call=True)
    assert row.finished_at >= row.started_at and row.ttft_s == 0.05


def test_closed_calls_are_not_billed_again_and_nothing_delivered_is_an_error_row(tmp_path):
    journal = CallJournal(tmp_path)
    done = opened(journal)
    journal.progress(done.invocation_id, delivered(5))
    journal.close(done.invocation_id)
    silent = opened(journal)
    rows, _ = left_by(journal, tmp_path)
    assert [(r.invocation_id, r.status, r.prompt_tokens, r.completion_tokens, r.cost) for r in rows] == [
        (silent.invocation_id, "error", 0, 0, Decimal(0))]


def test_a_stream_that_sent_done_is_ok_even_unmetered(tmp_path):
    journal = CallJournal(tmp_path)
    whole = opened(journal)
    journal.progress(whole.invocation_id, delivered(6))
    journal.progress(whole.invocation_id, delivered(6, done=True))
    (row,), _ = left_by(journal, tmp_path)
    assert (row.status, row.http_status, row.completion_tokens) == ("ok", 200, 6)


def test_a_torn_last_line_loses_only_that_line(tmp_path):
    journal = CallJournal(tmp_path)
    cut = opened(journal)
    journal.progress(cut.invocation_id, delivered(2))
    (segment,) = tmp_path.glob(CallJournal.PATTERN)
    with open(segment, "ab") as f:
        f.write(b"98 0badf00d {\"progress\":")         # the kill came mid-write
    (row,), corrupt = left_by(journal, tmp_path)
    assert (row.completion_tokens, corrupt) == (2, 1)


def test_rolled_segments_go_once_their_calls_close(tmp_path):
    journal = CallJournal(tmp_path, segment_bytes=1)    # every open rolls the segment
    first = opened(journal)
    second = opened(journal)
    assert len(list(tmp_path.glob(CallJournal.PATTERN))) == 2, "the first stays: its call is open"
    journal.close(first.invocation_id)
    assert len(list(tmp_path.glob(CallJournal.PATTERN))) == 1
    opened(journal)                                      # a third call, never closed
    journal.close(second.invocation_id)
    journal.shut()
    rows, _ = recover(sorted(tmp_path.glob(CallJournal.PATTERN)))
    assert len(rows) == 1, "only the third call, still open at shutdown"


def test_this_process_segments_are_not_leftovers(tmp_path):
    earlier = CallJournal(tmp_path)
    opened(earlier)
    now = CallJournal(tmp_path)
    opened(now)
    assert len(now.leftovers()) == 1 and len(list(tmp_path.glob(CallJournal.PATTERN))) == 2


def test_a_progress_frame_is_written_once_its_chunk_is_in_the_kernel(tmp_path):
    """uvloop (what `thawpool up` runs) queues a small write until the end of the loop's
    turn: a frame written right after the send would bill a chunk that a kill leaves in
    the process. The frame is written when the client's socket can already read it."""
    journal = CallJournal(tmp_path)
    call = opened(journal)
    seen_at_frame: list[bytes] = []

    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"data: chunk\n\n")          # the gateway's send of one chunk
            journal.progress_after_flush(call.invocation_id, delivered(1))
            await reader.read()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        client = socket.create_connection(server.sockets[0].getsockname()[:2])
        client.setblocking(False)
        write_frame = journal.progress

        def progress(invocation_id: str, seen: Delivered) -> None:
            try:
                seen_at_frame.append(client.recv(64, socket.MSG_PEEK))
            except BlockingIOError:
                seen_at_frame.append(b"")
            write_frame(invocation_id, seen)

        journal.progress = progress  # type: ignore[method-assign]
        try:
            while not seen_at_frame:
                await asyncio.sleep(0.01)
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    uvloop.run(main())
    assert seen_at_frame == [b"data: chunk\n\n"], "the frame was written before its chunk left the process"
    rows, _ = left_by(journal, tmp_path)
    assert [r.completion_tokens for r in rows] == [1]
