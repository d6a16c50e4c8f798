"""The tests' handler: each input says what predict does with the batch it is in.

{"echo": x} -> {"echo": x, "batch": <batch size>, "pid": <process id>, "instance": <made at load>}
{"fail": msg} -> raises ValueError(msg)           (the whole batch fails)
{"short": true} -> one result too few              (the whole batch fails)
{"exit": code} -> the process exits at once       (a crash mid-call)
{"env": true} -> {"env": sorted environment names}
{"alloc_mb": n} -> allocates n MB                 (MemoryError past the limit)
{"fetch": url} -> {"status": <HTTP status>} or {"error": ...}   (an ordinary GET: urllib, its proxy)
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any


class Probe:
    def load(self, model_dir: str) -> None:
        self.weights = (Path(model_dir) / "weights.txt").read_text().strip()
        # a sandboxed process is pid 2 of its own namespace, whichever replica it is
        self.instance = uuid.uuid4().hex

    def predict(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for item in inputs:
            if "exit" in item:
                os._exit(int(item["exit"]))
            if "fail" in item:
                raise ValueError(str(item["fail"]))
            if "alloc_mb" in item:
                bytearray(int(item["alloc_mb"]) * 1024 * 1024)
        if any(item.get("short") for item in inputs):
            return [{"echo": None}] * (len(inputs) - 1)
        return [self._one(item, len(inputs)) for item in inputs]

    def _one(self, item: dict[str, Any], batch: int) -> dict[str, Any]:
        if item.get("env"):
            return {"env": sorted(os.environ)}
        if "fetch" in item:
            return fetch(str(item["fetch"]))
        return {"echo": item.get("echo"), "batch": batch, "pid": os.getpid(), "weights": self.weights,
                "instance": self.instance}


def fetch(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return {"status": answer.status}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
