"""controlplane.batch.results, .pricing and routes.multipart: pure shapes."""
from __future__ import annotations

import json
from decimal import Decimal

from controlplane.batch.pricing import batch_pricing, line_pricing
from controlplane.batch.results import (error_line, invocation_id, output_line, request_counts,
                                        request_id)
from controlplane.billing.pricing import Pricing
from controlplane.routes.multipart import parse_form


def test_a_line_keeps_its_ids_across_runs_and_batches_differ():
    assert invocation_id("batch_a", 3) == invocation_id("batch_a", 3)
    assert len({invocation_id("batch_a", 3), invocation_id("batch_a", 4),
                invocation_id("batch_b", 3)}) == 3
    assert request_id("batch_a", 3) == "batch_a-3"


def test_output_and_error_lines_have_openais_shape():
    out = json.loads(output_line("batch_a", 0, "x", 200, {"choices": []}))
    assert out["custom_id"] == "x" and out["error"] is None and out["id"].startswith("batch_req_")
    assert out["response"] == {"status_code": 200, "request_id": "batch_a-0", "body": {"choices": []}}
    err = json.loads(error_line("batch_a", 1, None, "batch_expired", "late"))
    assert err["response"] is None and err["error"] == {"code": "batch_expired", "message": "late"}


def test_counts_leave_cancelled_lines_out_of_both():
    counts = request_counts(10, {"succeeded": 4, "failed": 1, "expired": 2, "cancelled": 3})
    assert counts.as_openai() == {"total": 10, "completed": 4, "failed": 3}


def test_the_batch_price_is_the_interactive_one_discounted():
    interactive = Pricing(Decimal("1000"), Decimal("100"), Decimal("3000"), Decimal("0.000000003"),
                          Decimal("0.01"))
    assert batch_pricing(interactive, Decimal("0.5")) == Pricing(
        Decimal("500"), Decimal("50"), Decimal("1500"), Decimal("0.000000002"), Decimal("0.005"))

    batch_row = Pricing(Decimal("1"), Decimal("1"), Decimal("2"))
    assert line_pricing(batch_row, interactive, Decimal("0.5")) == batch_row, "the book's batch row wins"
    assert line_pricing(None, interactive, Decimal("0.5")) == batch_pricing(interactive, Decimal("0.5"))


def test_a_multipart_form_gives_each_part_its_bytes():
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n{\"a\": 1}\n{\"b\": \"\xc3\xa9\"}\n\r\n--XyZ--\r\n")
    form = parse_form("multipart/form-data; boundary=XyZ", body)
    assert form["purpose"].data == b"batch"
    assert form["file"].filename == "in.jsonl"
    assert form["file"].data == b"{\"a\": 1}\n{\"b\": \"\xc3\xa9\"}\n"
