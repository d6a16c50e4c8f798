"""The lines of a batch's output and error files, in OpenAI's shapes, and the ids and
counts derived from a batch's lines. Pure.

Output line: `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error": null}`; error line: `{"id", "custom_id", "response": null, "error": {"code",
"message"}}`. A line's invocation id is derived from (batch id, line number), so a line
run again after a restart is metered under the same id and billed once
(`ON CONFLICT (invocation_id) DO NOTHING`).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# uuid5 namespace of batch lines' invocation ids (a fixed, random uuid)
LINE_NAMESPACE = uuid.UUID("7a0c3b55-4f0e-4d8e-9a55-3c1b0f1e2d91")
SUCCEEDED, FAILED, EXPIRED, CANCELLED = "succeeded", "failed", "expired", "cancelled"
IN_ERROR_FILE = (FAILED, EXPIRED, CANCELLED)


def invocation_id(batch_id: str, line: int) -> str:
    return str(uuid.uuid5(LINE_NAMESPACE, f"{batch_id}/{line}"))


def request_id(batch_id: str, line: int) -> str:
    """The line's request id (usage rows, logs, the replica): stable across restarts."""
    return f"{batch_id}-{line}"


def line_id(batch_id: str, line: int) -> str:
    return f"batch_req_{uuid.uuid5(LINE_NAMESPACE, f'req/{batch_id}/{line}').hex}"


def output_line(batch_id: str, line: int, custom_id: Optional[str], status_code: int,
                body: Any) -> str:
    return _dumps({"id": line_id(batch_id, line), "custom_id": custom_id,
                   "response": {"status_code": status_code,
                                "request_id": request_id(batch_id, line), "body": body},
                   "error": None})


def error_line(batch_id: str, line: int, custom_id: Optional[str], code: str,
               message: str) -> str:
    return _dumps({"id": line_id(batch_id, line), "custom_id": custom_id, "response": None,
                   "error": {"code": code, "message": message}})


def _dumps(value: dict[str, Any]) -> str:
    """One line, ASCII (a body may hold lone surrogates; the file is UTF-8 either way)."""
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class RequestCounts:
    total: int
    completed: int
    failed: int

    def as_openai(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}


def request_counts(total: int, by_status: Mapping[str, int]) -> RequestCounts:
    """OpenAI's counts: completed lines answered, failed ones refused or expired (a
    cancelled line that never ran is neither)."""
    return RequestCounts(total, by_status.get(SUCCEEDED, 0),
                         by_status.get(FAILED, 0) + by_status.get(EXPIRED, 0))
