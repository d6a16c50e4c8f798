"""Traffic splits: validation, the per-request choice (sticky by request id), rollback."""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

from controlplane.store.errors import InvalidField


def revision_number(name: str) -> int:
    return int(name[1:])


def parse_split(body: Any, revision_names: Iterable[str]) -> dict[str, int]:
    """{"r1": 90, "r2": 10}: known revisions, integer percents summing to 100."""
    known = set(revision_names)
    if not isinstance(body, dict) or not body:
        raise InvalidField("traffic", "must be an object like {\"r1\": 90, \"r2\": 10}")
    for name, percent in body.items():
        if name not in known:
            raise InvalidField(f"traffic.{name}", "no such revision")
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise InvalidField(f"traffic.{name}", "must be an integer percent 0-100")
    if sum(body.values()) != 100:
        raise InvalidField("traffic", f"percents must sum to 100, not {sum(body.values())}")
    return {name: percent for name, percent in sorted(body.items(), key=_order) if percent}


def choose(split: dict[str, int], request_id: str) -> str:
    """The revision for this request: the same request id always lands on the same one."""
    point = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") % 100
    upto = 0
    for name, percent in sorted(split.items(), key=_order):
        upto += percent
        if point < upto:
            return name
    raise ValueError("traffic split does not sum to 100")


def rollback_target(split: dict[str, int], revision_names: Iterable[str]) -> str:
    """The newest revision older than the newest one now taking traffic."""
    newest_live = max(revision_number(name) for name in split)
    older = [n for n in revision_names if revision_number(n) < newest_live]
    if not older:
        raise InvalidField("traffic", "no earlier revision to roll back to")
    return max(older, key=revision_number)


def _order(item: tuple[str, int]) -> int:
    return revision_number(item[0])
