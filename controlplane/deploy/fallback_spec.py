"""A deployment's fallbacks: the other deployments of its tenant a call goes to when the
deployment cannot answer it, in order, each with the conditions that send a call on.

    "fallbacks": [{"deployment": "small", "on": ["cold", "rate_limited", "error"],
                   "cold_wait_s": 5}]

- `cold`: the deployment has no ready replica and gets none within `cold_wait_s`
  (it keeps warming up for later calls);
- `rate_limited`: the pool's 429 for it (its tenant's GPU quota, or its queue full);
- `error`: its replica answered 5xx, or could not be reached, before the answer began.

Only the called deployment's own list is followed: a fallback's fallbacks never are, so
lists that name each other cannot loop and a call makes at most 1 + MAX_FALLBACKS
attempts. What holds across deployments (same tenant, exists, not itself, same kind and
task) is checked at deploy by `controlplane.deploy.deployer`; this module reads the body.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, get_args

from controlplane.fields import number, obj
from controlplane.store.errors import InvalidField

Condition = Literal["cold", "rate_limited", "error"]
CONDITIONS: tuple[Condition, ...] = get_args(Condition)
FIELDS = frozenset({"deployment", "on", "cold_wait_s"})
MAX_FALLBACKS = 3
DEFAULT_COLD_WAIT_S = 5.0
# a wait above this is no fallback for a cold start: the acquire's own timeout answers
MAX_COLD_WAIT_S = 600.0


@dataclass(frozen=True)
class Fallback:
    """One entry: where a call goes next, and on which conditions."""
    deployment: str
    on: tuple[Condition, ...] = CONDITIONS
    cold_wait_s: float = DEFAULT_COLD_WAIT_S

    def as_json(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "on": list(self.on), "cold_wait_s": self.cold_wait_s}


def parse_fallbacks(value: Any, own_name: Optional[str]) -> tuple[Fallback, ...]:
    """The body's `fallbacks`: a list of at most MAX_FALLBACKS entries, none naming the
    deployment itself (`own_name`) or one named before; InvalidField names the entry."""
    if not isinstance(value, list):
        raise InvalidField("fallbacks", "must be a list of {deployment, on, cold_wait_s}")
    if len(value) > MAX_FALLBACKS:
        raise InvalidField("fallbacks", f"at most {MAX_FALLBACKS} fallbacks")
    fallbacks = tuple(_entry(f"fallbacks[{i}]", raw) for i, raw in enumerate(value))
    for i, fallback in enumerate(fallbacks):
        if fallback.deployment == own_name:
            raise InvalidField(f"fallbacks[{i}].deployment", "a deployment is not its own fallback")
        if fallback.deployment in (f.deployment for f in fallbacks[:i]):
            raise InvalidField(f"fallbacks[{i}].deployment", f"{fallback.deployment!r} is listed twice")
    return fallbacks


def _entry(where: str, raw: Any) -> Fallback:
    entry = obj(where, raw, FIELDS)
    name = entry.get("deployment")
    if not isinstance(name, str) or not name:
        raise InvalidField(f"{where}.deployment", "the name of another deployment of yours is required")
    wait = number(f"{where}.cold_wait_s", entry.get("cold_wait_s", DEFAULT_COLD_WAIT_S), minimum=0.0)
    if wait > MAX_COLD_WAIT_S:
        raise InvalidField(f"{where}.cold_wait_s", f"must be <= {MAX_COLD_WAIT_S:g}")
    return Fallback(name, _conditions(f"{where}.on", entry.get("on", list(CONDITIONS))), wait)


def _conditions(where: str, value: Any) -> tuple[Condition, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidField(where, f"a non-empty list of {list(CONDITIONS)}")
    unknown = [c for c in value if c not in CONDITIONS]
    if unknown:
        raise InvalidField(where, f"unknown condition {unknown[0]!r}; one of {list(CONDITIONS)}")
    # the body's order does not matter: kept in CONDITIONS' order, each once
    return tuple(c for c in CONDITIONS if c in value)


def from_stored(rows: Sequence[Any]) -> tuple[Fallback, ...]:
    """The deployment row's `fallbacks` (JSON written by `as_json`) as entries."""
    return tuple(Fallback(str(r["deployment"]), tuple(c for c in CONDITIONS if c in r["on"]),
                          float(r["cold_wait_s"])) for r in rows)



@dataclass(frozen=True)
class Serves:
    """What a deployment answers, as far as a fallback must match it: its kind and its
    engine's task (a chat call cannot fall back to an embedding model)."""
    kind: str
    task: str


def mismatch(primary: Serves, fallback: Serves) -> Optional[str]:
    """Why `fallback` cannot answer the calls of `primary`, or None."""
    if fallback.kind != primary.kind:
        return f"is a {fallback.kind}; a model falls back to a model"
    if fallback.task != primary.task:
        return f"runs the {fallback.task!r} task, not {primary.task!r}"
    return None
