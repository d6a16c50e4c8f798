"""JSON a user sent, as a body or as text inside a field: parsed with a depth limit.

Python's json recursion ends in RecursionError (a 500) somewhere near a thousand
levels, and code that walks a parsed value (a JSON schema validator, a template)
recurses again, so both servers refuse anything nested deeper than MAX_JSON_DEPTH
with a 400 instead, whether it came as the body (`{"a": [[[...]]]}`) or as JSON text
in a string (`"guided_json": "[[[..."`, a tool call's `arguments`).
"""
from __future__ import annotations

import json
from typing import Any, Optional, Union

from wire.errors import ProtocolError

MAX_JSON_DEPTH = 64


class TooDeep(Exception):
    """JSON nested deeper than MAX_JSON_DEPTH (not a ValueError: callers that forgive
    text that is not JSON must still refuse this)."""


def loads(text: Union[str, bytes]) -> Any:
    """json.loads with the depth limit: ValueError when not JSON, TooDeep past the limit."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep() from None
    # text with fewer brackets than the limit cannot nest past it: counted in C, where
    # walking every value in Python would cost each small request a pass over its body
    if _brackets(text) > MAX_JSON_DEPTH and json_depth(value) > MAX_JSON_DEPTH:
        raise TooDeep()
    return value


def parse_json(text: Union[str, bytes], where: str, param: Optional[str] = None) -> Any:
    """The JSON value of `text`, or a 400 naming `where`: not JSON, or nested too deep."""
    try:
        return loads(text)
    except TooDeep:
        raise too_deep(where, param) from None
    except ValueError as exc:   # UnicodeDecodeError too
        detail = f" ({exc.msg} at {exc.pos})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ProtocolError(f"{where}: invalid JSON{detail}", param=param) from None


def too_deep(where: str, param: Optional[str] = None) -> ProtocolError:
    return ProtocolError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels",
                         param=param, code="too_deep")


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest (a scalar: 0), without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
        pending.extend((child, depth + 1) for child in children)
    return deepest


def _brackets(text: Union[str, bytes]) -> int:
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{")
    return text.count("[") + text.count("{")
