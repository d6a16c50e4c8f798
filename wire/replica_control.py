"""The replica's control API, spoken by the runtime's servers (runtime/serve/server.py,
runtime/functions/server.py) and read by the pool: its paths, and one typed message per
body that crosses them.

  GET  /health       Health: 200 ready, 500 failed (with `error`), 503 otherwise;
                     without the secret only `status` (Health.public)
  GET  /stats        Stats: what the replica served since its process started
  POST /admin/load   LoadRequest in, LOAD_ACCEPTED with LoadReply out (a standby only)
  POST /admin/likely LikelyModels in, LOAD_ACCEPTED with LikelyModels out (a standby only;
                     409 otherwise): the model folders a later /admin/load will likely
                     name, whose tokenizers the standby parses ahead, in the background
  POST /sleep        SleepReply (409 unless ready and idle)
  POST /wake         WakeReply (409 unless asleep)
  PUT  /admin/adapters/{name}   a LoRA adapter into the engine: ADAPTER_CONFIG_HEADER
                     carries its adapter_config.json, and its adapter_model.safetensors is
                     either the body or, on a replica started with ADAPTER_INBOX_FLAG, the
                     file ADAPTER_FILE_HEADER names in that folder (body empty);
                     AdapterReply out (400 naming the field, 404 for a named file that is
                     not there, 409 when the engine has no adapter slots, 413 above
                     MAX_WEIGHTS_BYTES)
  DELETE /admin/adapters/{name} AdapterReply (404 unknown, 409 while a request uses it)
  GET  /admin/adapters          AdapterList: the names loaded

A request then names an adapter as its `model`, and runs with it.

The adapter inbox spares the weights a trip through HTTP: the pool hard-links the
cached file into a folder of the replica's own, bound read-only into its sandbox
(pool/model_sandbox.py), names it in the PUT, and removes the link after the reply. A
name is one plain path component (`adapter_file`), which both sides check: the pool
before it links, the replica before it opens anything (runtime/serve/adapter_inbox.py).
The body stays the way for a replica without an inbox (the Ray backend's, a standalone
runtime.serve.server).

The runtime builds a message and sends `to_json()`; the pool reads one with `parse`.
A replica runs a tenant's code, so the pool takes nothing it says on trust: `parse`
keeps a number only within the bounds below (a counter is billed, seconds are shown
and recorded) and text only up to a length, raises `BadReply` when what the pool
acts on is missing, and leaves out fields it does not know, so a replica started by
an older pool, adopted across a restart, still parses. The load request goes the
other way: the pool builds it and the runtime parses it, refusing with a
`ProtocolError` (400) that names the field.
"""
from __future__ import annotations

import enum
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Optional

from wire.errors import ProtocolError

HEALTH_PATH = "/health"          # the one path answered without the secret
STATS_PATH = "/stats"
LOAD_PATH = "/admin/load"
LIKELY_PATH = "/admin/likely"
SLEEP_PATH = "/sleep"
WAKE_PATH = "/wake"
LOAD_ACCEPTED = 202              # the load goes on in the background; /health follows it
ADAPTERS_PATH = "/admin/adapters"
ADAPTER_CONFIG_HEADER = "x-thawpool-adapter-config"    # adapter_config.json, compact ASCII JSON
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")   # fullmatch: what the pool names them
ADAPTER_FILE_HEADER = "x-thawpool-adapter-file"     # in place of a body: a file in the adapter inbox
ADAPTER_INBOX_FLAG = "--adapter-inbox"               # runtime.serve.server's: the inbox folder, as it sees it
# one path component: letters and digits in runs joined by single dots, dashes or
# underscores, so never "/", "..", a leading dot or an empty name
ADAPTER_FILE = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")
MAX_ADAPTER_FILE = 128
MAX_ADAPTERS = 4096              # names one list may carry

MAX_COUNTER = 2 ** 53            # far past any replica's life, and exact as a JSON number
MAX_STAGES = 32                  # a replica's own timings: what a record, a log line, a page holds
MAX_STAGE_NAME = 64
MAX_STAGE_S = 86_400.0
MAX_TEXT = 2_000                 # an error or a name, as a status page shows it
MAX_PIDS = 64                    # tensor-parallel workers of one replica
MAX_LIKELY_MODELS = 4            # a standby keeps a few parsed tokenizers (each ~tens of MB)
MAX_MODEL_PATH = 4_096           # PATH_MAX


class BadReply(ValueError):
    """A replica's answer without what the pool needs from it."""


class HealthStatus(str, enum.Enum):
    STANDBY = "standby"          # warm, no model: waits for /admin/load
    LOADING = "loading"
    READY = "ready"
    SLEEPING = "sleeping"
    WAKING = "waking"
    FAILED = "failed"


_STATUSES = frozenset(s.value for s in HealthStatus)


@dataclass(frozen=True)
class Health:
    status: HealthStatus
    model: Optional[str] = None                  # the served name it loads or serves
    load_timings: Mapping[str, float] = field(default_factory=dict)   # stage seconds, once loaded
    error: Optional[str] = None                  # why it failed
    worker_pids: tuple[int, ...] = ()            # its tensor-parallel workers
    core_pid: Optional[int] = None               # its engine-core process

    @property
    def http_status(self) -> int:
        if self.status is HealthStatus.READY:
            return 200
        return 500 if self.status is HealthStatus.FAILED else 503

    def public(self) -> "Health":
        """What a caller without the secret learns: whether the replica is ready."""
        return Health(self.status)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": self.status.value}
        if self.model is not None:
            body["model"] = self.model
        if self.load_timings:
            body["load_timings"] = dict(self.load_timings)
        if self.worker_pids:
            body["tensor_parallel"] = {"size": 1 + len(self.worker_pids),
                                       "worker_pids": list(self.worker_pids)}
        if self.core_pid is not None:
            body["engine_core"] = {"pid": self.core_pid}
        if self.error is not None:
            body["error"] = self.error
        return body

    @classmethod
    def parse(cls, body: Any) -> "Health":
        """BadReply unless a JSON object with a known status."""
        body = _object(body)
        given = body.get("status")
        if not isinstance(given, str) or given not in _STATUSES:
            raise BadReply(f"health: unknown status {str(given)[:MAX_STAGE_NAME]!r}")
        return cls(HealthStatus(given), _text(body.get("model")), stages(body.get("load_timings")),
                   _text(body.get("error")), _pids(_mapping(body.get("tensor_parallel")).get("worker_pids")),
                   counter(_mapping(body.get("engine_core")).get("pid")))


@dataclass(frozen=True)
class Stats:
    """What a replica served since its process started: the pool bills by the token
    counters (at every heartbeat and as it stops the replica)."""
    model: Optional[str]
    requests: int
    prompt_tokens: int
    completion_tokens: int
    # a function replica's batching (a function has no tokens: its counters stay 0)
    items: Optional[int] = None
    batches: Optional[int] = None
    compute_s: Optional[float] = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "requests": self.requests,
                                "prompt_tokens": self.prompt_tokens,
                                "completion_tokens": self.completion_tokens}
        extra = {"items": self.items, "batches": self.batches, "compute_s": self.compute_s}
        body.update({k: v for k, v in extra.items() if v is not None})
        return body

    @classmethod
    def parse(cls, body: Any) -> "Stats":
        """BadReply unless both token counters are counters (`counter`); anything else
        out of range is left out (requests: 0)."""
        body = _object(body)
        prompt, completion = counter(body.get("prompt_tokens")), counter(body.get("completion_tokens"))
        if prompt is None or completion is None:
            raise BadReply("stats: prompt_tokens and completion_tokens must be counters")
        return cls(_text(body.get("model")), counter(body.get("requests")) or 0, prompt, completion,
                   counter(body.get("items")), counter(body.get("batches")),
                   _bounded_number(body.get("compute_s"), float(MAX_COUNTER)))


@dataclass(frozen=True)
class LoadRequest:
    """What a standby loads: a model folder, the name it serves it as, and its engine's
    options (runtime.LLM keyword arguments)."""
    model: str
    served_model_name: str
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "served_model_name": self.served_model_name,
                "engine": self.engine_kwargs}

    @classmethod
    def parse(cls, body: Any, engine_names: Collection[str]) -> "LoadRequest":
        """ProtocolError naming the field, for anything but a model folder, an optional
        name (default: the folder) and engine options among `engine_names`."""
        if not isinstance(body, dict):
            raise ProtocolError("request body must be a JSON object")
        unknown = sorted(set(body) - {"model", "served_model_name", "engine"})
        if unknown:
            raise ProtocolError(f"{unknown[0]}: unknown field", param=unknown[0])
        model, name = body.get("model"), body.get("served_model_name")
        engine_kwargs = body.get("engine") or {}
        if not isinstance(model, str) or not model:
            raise ProtocolError("model: must be a model folder path", param="model")
        if name is not None and not isinstance(name, str):
            raise ProtocolError("served_model_name: must be a string", param="served_model_name")
        if not isinstance(engine_kwargs, dict):
            raise ProtocolError("engine: must be an object of LLM keyword arguments", param="engine")
        bad = sorted(set(engine_kwargs) - set(engine_names))
        if bad:
            raise ProtocolError(f"engine.{bad[0]}: unknown engine argument", param="engine")
        return cls(model, name or model, engine_kwargs)


@dataclass(frozen=True)
class LikelyModels:
    """The model folders a standby will likely be told to load, most likely first (the
    pool's guess: pool/likely_models.py); the standby prepares what it can of them ahead
    (their tokenizers), and a wrong guess costs nothing at the load."""
    models: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"models": list(self.models)}

    @classmethod
    def parse(cls, body: Any) -> "LikelyModels":
        """ProtocolError naming the field, for anything but at most MAX_LIKELY_MODELS
        folder paths of at most MAX_MODEL_PATH characters each."""
        if not isinstance(body, dict):
            raise ProtocolError("request body must be a JSON object")
        unknown = sorted(set(body) - {"models"})
        if unknown:
            raise ProtocolError(f"{unknown[0]}: unknown field", param=unknown[0])
        models = body.get("models")
        if not isinstance(models, list):
            raise ProtocolError("models: must be a list of model folder paths", param="models")
        if len(models) > MAX_LIKELY_MODELS:
            raise ProtocolError(f"models: at most {MAX_LIKELY_MODELS} folders", param="models")
        for model in models:
            if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_PATH or "\0" in model:
                raise ProtocolError(f"models: each must be a folder path of 1 to {MAX_MODEL_PATH} "
                                    "characters", param="models")
        return cls(tuple(dict.fromkeys(models)))


@dataclass(frozen=True)
class LoadReply:
    status: HealthStatus          # loading, once accepted
    model: str                    # the served name

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "model": self.model}

    @classmethod
    def parse(cls, body: Any) -> "LoadReply":
        health = Health.parse(body)
        return cls(health.status, health.model or "")


@dataclass(frozen=True)
class FreedBytes:
    """The device memory one sleep gave back."""
    weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def to_json(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "total": self.total}

    @classmethod
    def parse(cls, body: Any) -> Optional["FreedBytes"]:
        given = _mapping(body)
        weights, kv_cache = counter(given.get("weights")), counter(given.get("kv_cache"))
        return cls(weights, kv_cache) if weights is not None and kv_cache is not None else None


@dataclass(frozen=True)
class SleepReply:
    """A replica asleep. What it reports is optional to the pool, which falls back on
    what it knows (the weights' size for host_bytes) where a number is missing or out
    of range."""
    host_bytes: Optional[int]               # weight bytes held in host memory while asleep
    sleep_s: Optional[float] = None
    freed: Optional[FreedBytes] = None

    def to_json(self) -> dict[str, Any]:
        return {"status": HealthStatus.SLEEPING.value,
                "sleep_s": None if self.sleep_s is None else round(self.sleep_s, 6),
                "freed_bytes": None if self.freed is None else self.freed.to_json(),
                "host_bytes": self.host_bytes}

    @classmethod
    def parse(cls, body: Any) -> "SleepReply":
        body = _object(body)
        return cls(counter(body.get("host_bytes")), _bounded_number(body.get("sleep_s"), MAX_STAGE_S),
                   FreedBytes.parse(body.get("freed_bytes")))


@dataclass(frozen=True)
class WakeReply:
    wake_timings: Mapping[str, float] = field(default_factory=dict)   # the stages of the way back

    def to_json(self) -> dict[str, Any]:
        return {"status": HealthStatus.READY.value, "wake_timings": dict(self.wake_timings)}

    @classmethod
    def parse(cls, body: Any) -> "WakeReply":
        return cls(stages(_object(body).get("wake_timings")))


@dataclass(frozen=True)
class AdapterReply:
    """An adapter loaded into the engine (PUT) or removed from it (DELETE)."""
    name: str
    loaded: bool
    load_s: Optional[float] = None        # the replica's time to read and install it

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "loaded": self.loaded,
                "load_s": None if self.load_s is None else round(self.load_s, 6)}

    @classmethod
    def parse(cls, body: Any) -> "AdapterReply":
        body = _object(body)
        name = body.get("name")
        if not isinstance(name, str) or not ADAPTER_NAME.fullmatch(name):
            raise BadReply("adapter: name missing or malformed")
        return cls(name, body.get("loaded") is True, _bounded_number(body.get("load_s"), MAX_STAGE_S))


@dataclass(frozen=True)
class AdapterList:
    names: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"adapters": list(self.names)}

    @classmethod
    def parse(cls, body: Any) -> "AdapterList":
        given = _object(body).get("adapters")
        if not isinstance(given, list):
            raise BadReply("adapters: must be a list of names")
        return cls(tuple(n for n in given[:MAX_ADAPTERS] if isinstance(n, str) and ADAPTER_NAME.fullmatch(n)))


def adapter_file(given: str) -> str:
    """A file name of the adapter inbox as ADAPTER_FILE_HEADER carries it; ProtocolError
    (400) naming the header for anything but one plain path component (ADAPTER_FILE)."""
    if len(given) > MAX_ADAPTER_FILE or not ADAPTER_FILE.fullmatch(given):
        raise ProtocolError(f"{ADAPTER_FILE_HEADER}: {given[:80]!r} is not a file name of the adapter inbox "
                            f"(one path component: {ADAPTER_FILE.pattern}, at most {MAX_ADAPTER_FILE} "
                            "characters)", param=ADAPTER_FILE_HEADER)
    return given


# ---------------------------------------------------------------- bounds

def counter(value: Any) -> Optional[int]:
    """A replica's counter as the pool keeps it: an int (not a bool) in [0, MAX_COUNTER)
    (a BIGINT column holds it); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNTER:
        return None
    return value


def stages(timings: Any) -> dict[str, float]:
    """A replica's stage timings (load_timings, wake_timings): at most MAX_STAGES of them,
    named in at most MAX_STAGE_NAME characters, each a finite number from 0 to
    MAX_STAGE_S; anything else a replica sends there is left out."""
    if not isinstance(timings, Mapping):
        return {}
    kept = ((str(k)[:MAX_STAGE_NAME], seconds) for k, v in timings.items()
            if (seconds := _bounded_number(v, MAX_STAGE_S)) is not None)
    return dict(itertools.islice(kept, MAX_STAGES))


def _text(value: Any) -> Optional[str]:
    """A replica's string, cut to MAX_TEXT characters; None when not a string."""
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _pids(value: Any) -> tuple[int, ...]:
    pids = value[:MAX_PIDS] if isinstance(value, list) else []
    return tuple(p for p in pids if counter(p) is not None)


def _bounded_number(value: Any, limit: float) -> Optional[float]:
    """A JSON number (not a bool) from 0 to limit as a float; None otherwise (NaN too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= limit:
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) else None


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise BadReply(f"expected a JSON object, got {type(body).__name__}")
    return body


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
