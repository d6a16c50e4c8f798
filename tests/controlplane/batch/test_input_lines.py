"""controlplane.batch.input_lines: each refusal by name, the order kept, a file that is
not JSONL refused whole."""
from __future__ import annotations

import json

import pytest

from controlplane.batch.input_lines import BadLine, InputLine, NotJsonl, parse_lines

CHAT = "/v1/chat/completions"


def line(custom_id="a", url=CHAT, method="POST", **body):
    return json.dumps({"custom_id": custom_id, "method": method, "url": url,
                       "body": {"model": "m", "messages": [], **body}})


def parse(*lines: str, endpoint=CHAT, max_lines=100):
    return parse_lines("\n".join(lines).encode(), endpoint, max_lines)


def test_good_lines_keep_their_order_and_blank_lines_are_skipped():
    parsed = parse(line("x"), "", "   ", line("y"))
    assert parsed == [InputLine(0, "x", {"model": "m", "messages": []}),
                      InputLine(1, "y", {"model": "m", "messages": []})]


def test_each_bad_line_is_named_and_the_rest_stand():
    parsed = parse(line("a"), "not json", line("a"), line("b", url="/v1/completions"),
                   line("c", method="GET"), line("d", stream=True), json.dumps({"custom_id": 5}),
                   json.dumps({"custom_id": "e", "method": "POST", "url": CHAT, "body": {}}))
    assert isinstance(parsed[0], InputLine)
    assert [(p.line, p.custom_id, p.code) for p in parsed[1:] if isinstance(p, BadLine)] == [
        (1, None, "invalid_json_line"), (2, "a", "duplicate_custom_id"),
        (3, "b", "mismatched_endpoint"), (4, "c", "invalid_method"), (5, "d", "invalid_request"),
        (6, None, "missing_required_parameter"), (7, "e", "invalid_request")]
    assert parsed[7].message == "line 8: body.model: the deployment name is required"


@pytest.mark.parametrize("data, why", [
    (b"\xff\xfe", "UTF-8"), (b"\n \n", "no lines"), (b"a,b,c\n1,2,3\n", "no line of the file")])
def test_a_file_that_is_not_jsonl_is_refused_whole(data, why):
    with pytest.raises(NotJsonl, match=why):
        parse_lines(data, CHAT, 100)


def test_too_many_lines_is_refused_whole():
    with pytest.raises(NotJsonl, match="at most 2"):
        parse(line("a"), line("b"), line("c"), max_lines=2)
