"""A function package: a folder with `thawpool.toml`, the handler's code and its weights.

```toml
[function]
handler = "classifier:TextClassifier"   # module:Class, imported from the package folder
requirements = ["regex==2024.11.6"]     # pip requirement strings, installed per revision

[resources]                             # what one replica needs (the deploy's defaults)
gpu_memory_gb = 1.0
gpu_count = 1

[batching]                              # dynamic batching in the replica
max_batch_size = 32
max_wait_ms = 10
```

The handler class is built with no arguments; `load(self, model_dir)` is called once
with the package folder, `predict(self, inputs: list[dict]) -> list[dict]` once per
batch. Pure Python (tomllib): the control plane checks a package at deploy with the
same `parse_package` the replica runs, and every refusal is a `ValueError` whose
message starts with the field's name.
"""
from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping

MANIFEST = "thawpool.toml"
MANIFEST_MAX_BYTES = 64 * 1024
HANDLER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
# A requirement line for pip, never an option: "--index-url ..." or "-e ..." in a tenant's
# file would point the node's installer elsewhere, so a line must start with a name.
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*"
                         r"([<>=!~]=?[^;\s]+(\s*,\s*[<>=!~]=?[^;\s]+)*)?$")
MAX_REQUIREMENTS = 100
MAX_BATCH_SIZE = 4096
MAX_WAIT_MS = 60_000
SECTIONS = {"function": {"handler", "requirements"},
            "resources": {"gpu_memory_gb", "gpu_count"},
            "batching": {"max_batch_size", "max_wait_ms"}}


@dataclass(frozen=True)
class Batching:
    max_batch_size: int = 8
    max_wait_ms: float = 5.0


@dataclass(frozen=True)
class FunctionPackage:
    handler: str                              # module:Class
    requirements: tuple[str, ...] = ()
    gpu_memory_gb: float = 1.0
    gpu_count: int = 1
    batching: Batching = Batching()

    @property
    def module(self) -> str:
        return self.handler.split(":", 1)[0]

    @property
    def class_name(self) -> str:
        return self.handler.split(":", 1)[1]

    @property
    def requirements_hash(self) -> str:
        """What a per-revision environment is cached by: the sorted requirement lines."""
        return hashlib.sha256("\n".join(sorted(self.requirements)).encode()).hexdigest()[:24]


def parse_manifest(raw: bytes) -> FunctionPackage:
    """thawpool.toml's bytes -> the package; ValueError naming the field."""
    if len(raw) > MANIFEST_MAX_BYTES:
        raise ValueError(f"{MANIFEST}: over {MANIFEST_MAX_BYTES} bytes")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{MANIFEST}: not valid TOML ({exc})") from None
    return parse_package(doc)


def parse_package(doc: Mapping[str, Any]) -> FunctionPackage:
    _known("", doc, set(SECTIONS))
    function = _section(doc, "function")
    resources = _section(doc, "resources")
    batching = _section(doc, "batching")
    return FunctionPackage(
        handler=_handler(function.get("handler")),
        requirements=_requirements(function.get("requirements", [])),
        gpu_memory_gb=_number("resources.gpu_memory_gb", resources.get("gpu_memory_gb", 1.0)),
        gpu_count=_integer("resources.gpu_count", resources.get("gpu_count", 1), 1, 64),
        batching=Batching(
            max_batch_size=_integer("batching.max_batch_size",
                                    batching.get("max_batch_size", Batching.max_batch_size),
                                    1, MAX_BATCH_SIZE),
            max_wait_ms=float(_integer("batching.max_wait_ms",
                                       batching.get("max_wait_ms", int(Batching.max_wait_ms)),
                                       0, MAX_WAIT_MS))))


def _section(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a table")
    _known(f"{name}.", value, SECTIONS[name])
    return value


def _known(prefix: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"{prefix}{unknown[0]}: unknown field")


def _handler(value: Any) -> str:
    if value is None:
        raise ValueError("function.handler: is required (module:Class)")
    if not isinstance(value, str) or not HANDLER.match(value):
        raise ValueError("function.handler: must be module:Class, e.g. 'classifier:TextClassifier'")
    return value


def _requirements(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_REQUIREMENTS:
        raise ValueError(f"function.requirements: a list of at most {MAX_REQUIREMENTS} strings")
    for i, line in enumerate(value):
        if not isinstance(line, str) or not REQUIREMENT.match(line.strip()):
            raise ValueError(f"function.requirements[{i}]: a requirement like 'name==1.2' "
                             "(no pip options, URLs or paths)")
    return tuple(line.strip() for line in value)


def _integer(name: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name}: an integer from {minimum} to {maximum}")
    return value


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ValueError(f"{name}: a number above 0")
    return float(value)
