"""A batch's input file, line by line: what needs no deployment (JSON, custom_id, method,
url, body), as OpenAI checks it. Pure: the deployment and the gateway's own request rules
are checked by controlplane.batch.service over what this lets through.

A file that is not UTF-8, holds no line, or holds no JSON object at all is refused whole
(NotJsonl, a 400); any other bad line becomes that line's error, the rest run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Union

from wire.errors import ProtocolError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_CUSTOM_ID = 512


class NotJsonl(ValueError):
    """The file as a whole is not a JSONL batch input."""


@dataclass(frozen=True)
class InputLine:
    """A line that passed these checks: its request, still to be checked by the gateway."""
    line: int                      # 0-based, among the file's non-blank lines
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class BadLine:
    line: int
    custom_id: Optional[str]       # when the line carried a usable one
    code: str
    message: str


Parsed = Union[InputLine, BadLine]


def gateway_path(endpoint: str) -> str:
    """The gateway's name for an endpoint: /v1/chat/completions -> chat/completions."""
    return endpoint.removeprefix("/v1/")


def parse_lines(data: bytes, endpoint: str, max_lines: int) -> list[Parsed]:
    """Every non-blank line, in order; NotJsonl when the file is not JSONL at all."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotJsonl("the file is not UTF-8 text") from None
    raw = [line for line in text.splitlines() if line.strip()]
    if not raw:
        raise NotJsonl("the file holds no lines")
    if len(raw) > max_lines:
        raise NotJsonl(f"the file holds {len(raw)} lines; a batch takes at most {max_lines}")
    seen: set[str] = set()
    parsed = [_parse_line(n, line, endpoint, seen) for n, line in enumerate(raw)]
    if all(isinstance(p, BadLine) and p.code == "invalid_json_line" for p in parsed):
        raise NotJsonl("no line of the file is a JSON object: JSONL is one JSON object per line")
    return parsed


def _parse_line(n: int, raw: str, endpoint: str, seen: set[str]) -> Parsed:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return BadLine(n, None, "invalid_json_line", f"line {n + 1}: not a JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return BadLine(n, None, "missing_required_parameter",
                       f"line {n + 1}: custom_id: a non-empty string of at most {MAX_CUSTOM_ID} "
                       "characters is required")
    if custom_id in seen:
        return BadLine(n, custom_id, "duplicate_custom_id",
                       f"line {n + 1}: custom_id {custom_id!r} is not unique in the file")
    seen.add(custom_id)
    problem = _request_problem(value, endpoint)
    if problem is not None:
        return BadLine(n, custom_id, problem[0], f"line {n + 1}: {problem[1]}")
    return InputLine(n, custom_id, value["body"])


def _request_problem(value: dict[str, Any], endpoint: str) -> Optional[tuple[str, str]]:
    if value.get("method") != "POST":
        return "invalid_method", "method: must be \"POST\""
    if value.get("url") != endpoint:
        return "mismatched_endpoint", f"url: must be the batch's endpoint {endpoint}"
    body = value.get("body")
    if not isinstance(body, dict):
        return "invalid_request", "body: must be a JSON object"
    if body.get("stream") is True:
        return "invalid_request", "body.stream: a batch request is not streamed"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "invalid_request", "body.model: the deployment name is required"
    return None


def invalid(field: str, message: str) -> ProtocolError:
    """A Files or Batches request refused for a field (400, as OpenAI answers it)."""
    return ProtocolError(f"{field}: {message}", param=field, code="invalid_request")
