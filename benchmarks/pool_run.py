"""A poolsim trace through a real `thawpool up` (tests/faults/stack.py): its deployments
created as `Scaling` says, its requests replayed at their times (benchmarks/trace_replay.py),
then what the platform itself reports over the trace's window: the replicas it placed,
from its replica lifetimes, and the GPU-seconds it bills, from GET /v1/billing/report;
with the CPU time each part of the stack used meanwhile (this machine runs other work too).
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import httpx

from benchmarks.cpu_time import machine_cpu, tree_cpu_s
from benchmarks.trace_replay import Sent, replay
from poolsim.workload import Trace
from tests.faults.stack import HEARTBEAT_S, FaultStack

Deploy = Callable[[str, str, str], None]           # (tenant key, deployment name, model URI)


@dataclass(frozen=True)
class Scaling:
    """What every deployment is created with, as the simulator's policy scales it."""
    idle_timeout_s: float
    max_replicas: int
    target_concurrency: int
    replica_memory_gb: float         # declared: how much of a slot one replica reserves
    kv_cache_tokens: int

    def body(self, name: str, uri: str) -> dict[str, Any]:
        return {"name": name, "model_uri": uri, "resources": {"gpu_memory_gb": self.replica_memory_gb},
                "scaling": {"min_replicas": 0, "max_replicas": self.max_replicas,
                            "target_concurrency": self.target_concurrency, "idle_timeout_s": self.idle_timeout_s},
                "engine": {"kv_cache_tokens": self.kv_cache_tokens}}


@dataclass(frozen=True)
class RealRun:
    sent: list[Sent]
    replicas: list[dict[str, Any]]   # placed in the window: deployment, placed/ready/stopped s from its start
    gpu_seconds: dict[str, float]    # billed in the window, per deployment
    cpu: dict[str, float]            # CPU seconds over the replay, per part (cpu_use)

    @property
    def starts(self) -> dict[str, int]:
        """Replicas placed in the window, per deployment."""
        found: dict[str, int] = {}
        for r in self.replicas:
            found[r["deployment"]] = found.get(r["deployment"], 0) + 1
        return found


def deployer(stack: FaultStack, scaling: Scaling) -> Deploy:
    def deploy(key: str, name: str, uri: str) -> None:
        response = httpx.post(f"{stack.base_url}/v1/deployments", timeout=60, headers=auth(key),
                              json=scaling.body(name, uri))
        if response.status_code != 201:
            raise RuntimeError(f"deploy {name}: {response.status_code} {response.text}")
    return deploy


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def run(stack: FaultStack, trace: Trace, uris: Mapping[str, str], scaling: Scaling, vocab: int) -> RealRun:
    """Deploys the trace's deployments, replays it from now and reads the books once the
    window has closed and a heartbeat has reported every replica's time in it."""
    keys = {t: stack.tenant_key(t) for t in sorted({d.tenant for d in trace.deployments})}
    deploy = deployer(stack, scaling)
    for dep in trace.deployments:
        deploy(keys[dep.tenant], dep.name, uris[dep.name])
    before, start = cpu_use(stack), datetime.now(timezone.utc)
    sent = await replay(stack.base_url, {d.name: keys[d.tenant] for d in trace.deployments}, trace.requests(), vocab)
    cpu = {part: used - before[part] for part, used in cpu_use(stack).items()}
    end = start + timedelta(seconds=trace.duration_s)
    await asyncio.sleep(max(0.0, (end - datetime.now(timezone.utc)).total_seconds()) + 2 * HEARTBEAT_S)
    billed = {dep: s for key in keys.values() for dep, s in gpu_seconds(stack, key, start, end).items()}
    return RealRun(sent, await replicas(stack, list(keys), start, end), billed, cpu)


async def open_replicas(stack: FaultStack, tenants: Sequence[str]) -> int:
    """Replicas of these tenants the pool has not recorded as stopped."""
    import asyncpg

    conn = await asyncpg.connect(stack.pg.libpq_uri)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM replica_lifetimes l JOIN tenants t ON t.id = l.tenant_id "
            "WHERE t.name = ANY($1::text[]) AND l.stopped_at IS NULL", list(tenants)))
    finally:
        await conn.close()


async def replicas(stack: FaultStack, tenants: Sequence[str], start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Replicas placed in the window, from the platform's own lifetimes: each one's
    deployment, its placement, readiness and stop in seconds from `start`, and why it stopped."""
    import asyncpg

    conn = await asyncpg.connect(stack.pg.libpq_uri)
    try:
        rows = await conn.fetch(
            "SELECT d.name, l.placed_at, l.ready_at, l.stopped_at, l.reason FROM replica_lifetimes l "
            "JOIN deployments d ON d.id = l.deployment_id JOIN tenants t ON t.id = l.tenant_id "
            "WHERE t.name = ANY($1::text[]) AND l.placed_at >= $2 AND l.placed_at < $3 ORDER BY l.placed_at",
            list(tenants), start, end)
    finally:
        await conn.close()

    def since(when: Optional[datetime]) -> Optional[float]:
        return None if when is None else round((when - start).total_seconds(), 3)
    return [{"deployment": row["name"], "placed_s": since(row["placed_at"]), "ready_s": since(row["ready_at"]),
             "stopped_s": since(row["stopped_at"]), "reason": row["reason"]} for row in rows]


def gpu_seconds(stack: FaultStack, key: str, start: datetime, end: datetime) -> dict[str, float]:
    """GET /v1/billing/report by deployment over the window: each deployment's GPU-seconds."""
    response = httpx.get(f"{stack.base_url}/v1/billing/report", timeout=60, headers=auth(key),
                         params={"from": start.isoformat(), "to": end.isoformat(), "group_by": "deployment"})
    response.raise_for_status()
    return {row["key"]: float(row["gpu_seconds"]) for row in response.json()["rows"]}


def cpu_use(stack: FaultStack) -> dict[str, float]:
    """CPU seconds so far: of each part of the stack, this client, and the whole machine."""
    assert stack.plane is not None and stack.plane.process is not None and stack.s3.process is not None
    machine, own = machine_cpu(), os.times()
    return {"thawpool up and its replicas": tree_cpu_s(stack.plane.process.pid),
            "postgres": tree_cpu_s(stack.pg.pid or 0), "s3": tree_cpu_s(stack.s3.process.pid),
            "this client": own.user + own.system, "machine busy": machine.busy_s, "machine": machine.total_s}


def write_run(run: RealRun, requests_path: Path, replicas_path: Path) -> None:
    """Every real request as the client saw it and every replica, one JSON line each."""
    replicas_path.write_text("".join(json.dumps(r) + "\n" for r in run.replicas))
    with open(requests_path, "w") as out:
        for s in run.sent:
            r, a = s.request, s.answer
            out.write(json.dumps({"at_s": r.at_s, "deployment": r.deployment, "prompt_tokens": r.prompt_tokens,
                                  "output_tokens": r.output_tokens, "late_s": round(s.late_s, 4),
                                  "status": a.status, "ttft_s": a.ttft_s, "total_s": round(a.total_s, 4),
                                  "tokens": a.tokens}) + "\n")
