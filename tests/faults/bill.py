"""Holding the bill against what really happened: the usage rows against what every
client received, GPU time against the replica processes' real lives, and the replicas'
own counters against the rows (`thawpool admin reconcile`, the real command)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

import asyncpg

from tests.controlplane.support.servers import REPO
from tests.faults.stack import HEARTBEAT_S, ControlPlaneProcess, alive
from tests.faults.traffic import Call, Ledger
from tests.support.waiting import eventually

SLACK_S = 1.0       # how late a busy 2-core machine may notice and stamp an exit


async def _fetch(libpq_uri: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(libpq_uri)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def usage_rows(libpq_uri: str, tenant: str) -> list[asyncpg.Record]:
    return await _fetch(libpq_uri, "SELECT u.request_id, u.status, u.prompt_tokens, u.completion_tokens, "
                        "u.replica_id, u.recovered FROM usage_events u JOIN tenants t ON t.id = u.tenant_id "
                        "WHERE t.name = $1", tenant)


async def lifetimes(libpq_uri: str, tenant: str) -> list[asyncpg.Record]:
    return await _fetch(libpq_uri, "SELECT r.* FROM replica_lifetimes r JOIN tenants t ON t.id = r.tenant_id "
                        "WHERE t.name = $1", tenant)


async def settled_rows(libpq_uri: str, ledger: Ledger, tenant: str,
                       timeout_s: float = 60) -> list[asyncpg.Record]:
    """The tenant's rows once every call that received a token has one (the outbox may
    still be replaying)."""
    owed = {c.request_id for c in ledger.calls if c.tenant == tenant and (c.prompt_tokens or c.completion_tokens)}

    async def landed() -> Optional[list[asyncpg.Record]]:
        rows = await usage_rows(libpq_uri, tenant)
        return rows if owed <= {r["request_id"] for r in rows} else None
    return await eventually(landed, timeout_s=timeout_s, every_s=0.25,
                            what=f"a usage row for each of {len(owed)} calls of {tenant}")


def assert_billed_as_received(ledger: Ledger, rows: list[asyncpg.Record], tenant: str) -> None:
    """0 lost, 0 doubled, and each row holds exactly the tokens its client received; a
    call cut by the control plane's death (a `recovered` row) may be billed one chunk
    behind, never ahead: B-CP-3's window between a chunk handed to the client's
    connection and its journal frame."""
    calls = {c.request_id: c for c in ledger.calls if c.tenant == tenant}
    ids = [r["request_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a call billed twice"
    assert set(ids) <= set(calls), "a row for a call nobody made"
    by_id = {r["request_id"]: r for r in rows}

    def billed(request_id: str) -> tuple[int, int]:
        row = by_id.get(request_id)
        return (row["prompt_tokens"], row["completion_tokens"]) if row else (0, 0)

    def owed(request_id: str, call: Call) -> tuple[int, int]:
        """What the row must hold: what the client received, or for a recovered row the
        chunk before when that is what it holds."""
        row = by_id.get(request_id)
        behind = (call.prompt_tokens, call.previous_completion_tokens)
        if row is not None and row["recovered"] and not call.finished and billed(request_id) == behind:
            return behind
        return call.prompt_tokens, call.completion_tokens
    wrong = [(c, billed(rid), by_id[rid]["status"] if rid in by_id else None) for rid, c in calls.items()
             if owed(rid, c) != billed(rid)]
    assert not wrong, f"calls billed other than received (call, billed, row status): {wrong[:5]}"
    statuses = {rid: by_id[rid]["status"] for rid, c in calls.items() if rid in by_id}
    mislabelled = [(rid, statuses[rid]) for rid, c in calls.items() if rid in statuses
                   and statuses[rid] != _expected_status(c.finished, owed(rid, c)[1])]
    assert not mislabelled, f"whole answers billed ok, cut ones partial: {mislabelled[:5]}"
    billed_total = (sum(r["prompt_tokens"] for r in rows), sum(r["completion_tokens"] for r in rows))
    assert billed_total == (sum(owed(rid, c)[0] for rid, c in calls.items()),
                            sum(owed(rid, c)[1] for rid, c in calls.items()))


def _expected_status(finished: bool, completion_tokens: int) -> str:
    """A whole answer is `ok`; a cut one `partial` with the tokens delivered, else `error`."""
    if finished:
        return "ok"
    return "partial" if completion_tokens else "error"


@dataclass
class Life:
    """A runtime process as seen from outside: since when it served a replica (a warm
    standby runs before it is given one) and when it was gone."""
    pid: int
    replica_id: Optional[str] = None
    replica_at: Optional[datetime] = None
    gone_at: Optional[datetime] = None


class ReplicaWatch:
    """Polls the pool's registry of runtime processes and /proc, in a thread, to know each
    replica's real life without asking the control plane (which may be dead)."""

    def __init__(self, plane: ControlPlaneProcess, every_s: float = 0.05):
        self.plane, self.every_s = plane, every_s
        self.lives: dict[int, Life] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ReplicaWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            time.sleep(self.every_s)

    def poll(self) -> None:
        now = datetime.now(timezone.utc)
        for pid, replica_id in self.plane.replica_pids().items():
            life = self.lives.setdefault(pid, Life(pid))
            if life.replica_id is None and replica_id is not None:
                life.replica_id, life.replica_at = replica_id, now
        for life in self.lives.values():
            if life.gone_at is None and not alive(life.pid):
                life.gone_at = now

    def replicas(self) -> list[Life]:
        """Processes that served a replica (not warm standbys that never did)."""
        return [life for life in self.lives.values() if life.replica_id is not None]

    def running(self) -> list[Life]:
        return [life for life in self.replicas() if life.gone_at is None]

    def of(self, replica_id: str) -> Life:
        found = [life for life in self.lives.values() if life.replica_id == replica_id]
        assert len(found) == 1, (replica_id, self.lives)
        return found[0]


def assert_gpu_time_true(rows: list[asyncpg.Record], watch: ReplicaWatch) -> None:
    """Each lifetime that ran a process is billed from its placement, which came before its
    process was given the replica (a cold start may wait for a warm standby meanwhile,
    holding its slot), to within one heartbeat of when that process was really gone."""
    beat, slack = timedelta(seconds=HEARTBEAT_S), timedelta(seconds=SLACK_S)
    for row in rows:
        if row["placed_at"] is None or not any(life.replica_id == row["replica_id"] for life in watch.replicas()):
            continue
        life = watch.of(row["replica_id"])
        assert life.gone_at is not None and life.replica_at is not None, f"replica {row['replica_id']} still runs"
        end = row["stopped_at"] or row["last_seen_at"]
        assert row["placed_at"] <= life.replica_at + slack, ("billed from after it served", row, life)
        assert life.gone_at - beat - slack <= end <= life.gone_at + slack, \
            ("billed end not within a heartbeat of the real end", end, life)


def reconcile(database_url: str, start: datetime, end: datetime) -> tuple[int, str]:
    """`thawpool admin reconcile` as an operator runs it: exit status and output."""
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "admin", "reconcile", "--from", start.isoformat(),
         "--to", end.isoformat(), "--database-url", database_url],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr
