"""The tenant's handler inside its replica: imported from the package, loaded once,
called once per batch, and held to its contract.

`predict(inputs)` must return a list of JSON objects, one per input, in order. A
handler that raises, or answers with another length or with something that is not
a JSON object, fails that batch with `HandlerError` (its message says which), never a
mismatched answer. Runs on the worker thread (runtime/functions/worker.py), never on
the event loop.
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any, Protocol

from spec.function_package import FunctionPackage


class Handler(Protocol):
    def load(self, model_dir: str) -> None: ...

    def predict(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


class HandlerError(Exception):
    """predict broke its contract or raised; every item of the batch gets this."""


def load_handler(package: FunctionPackage, package_dir: Path) -> Handler:
    """Import `module:Class` from the package folder, build it and call load(folder)."""
    sys.path.insert(0, str(package_dir))
    module = importlib.import_module(package.module)
    cls = getattr(module, package.class_name, None)
    if cls is None:
        raise ImportError(f"function.handler: {package.module} has no {package.class_name}")
    handler: Handler = cls()
    handler.load(str(package_dir))
    return handler


def run_batch(handler: Handler, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One predict call, checked: as many JSON objects as inputs, or HandlerError."""
    try:
        outputs = handler.predict(inputs)
    except Exception as exc:  # noqa: BLE001 - the tenant's code: any error fails the batch
        last = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        raise HandlerError(f"predict raised {type(exc).__name__}: {exc}{where}") from exc
    if not isinstance(outputs, list):
        raise HandlerError(f"predict returned {type(outputs).__name__}, not a list")
    if len(outputs) != len(inputs):
        raise HandlerError(f"predict returned {len(outputs)} results for {len(inputs)} inputs")
    for i, output in enumerate(outputs):
        if not isinstance(output, dict):
            raise HandlerError(f"predict result {i} is {type(output).__name__}, not a dict")
    try:
        json.dumps(outputs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise HandlerError(f"predict returned results that are not JSON: {exc}") from None
    return outputs
