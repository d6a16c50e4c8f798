"""The body of a function invocation, parsed by the same rule at the edge and in the replica.

`{"input": {...}}` is one item and answers `{"output": {...}}`; `{"inputs": [{...},
...]}` is several and answers `{"outputs": [...]}` in the same order. Each item is a
JSON object; the replica batches items, not requests. Pure Python: the control plane
imports it (it must not import torch), so bad input is a 400 naming the field before
any replica is woken, and the replica refuses the same input the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wire.errors import ProtocolError

MAX_ITEMS = 1024
FIELDS = frozenset({"input", "inputs"})


@dataclass(frozen=True)
class FunctionRequest:
    items: tuple[dict[str, Any], ...]
    single: bool                          # {"input": ...}: answered as {"output": ...}

    def answer(self, outputs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"output": outputs[0]} if self.single else {"outputs": outputs}


def parse_function_request(body: Any) -> FunctionRequest:
    """ProtocolError (400) naming the field for anything but one of the two shapes."""
    if not isinstance(body, dict):
        raise ProtocolError("body: must be a JSON object", param="body")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise ProtocolError(f"{unknown[0]}: unknown field (send 'input' or 'inputs')", param=unknown[0])
    if ("input" in body) == ("inputs" in body):
        raise ProtocolError("body: exactly one of 'input' (an object) or 'inputs' (a list)", param="body")
    if "input" in body:
        return FunctionRequest((_item("input", body["input"]),), single=True)
    inputs = body["inputs"]
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_ITEMS:
        raise ProtocolError(f"inputs: a list of 1 to {MAX_ITEMS} objects", param="inputs")
    return FunctionRequest(tuple(_item(f"inputs[{i}]", v) for i, v in enumerate(inputs)), single=False)


def _item(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{name}: must be a JSON object", param=name)
    return value
