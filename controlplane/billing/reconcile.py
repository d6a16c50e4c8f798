"""`thawpool admin reconcile --from --to`: what each replica says it served against the
usage rows billed for it, and any drift between them.

Every replica counts the prompt and completion tokens of each request it finishes or
aborts (runtime /stats); the pool sends these counters with every heartbeat and reads
them one last time as it stops the replica (`replica_lifetimes.served_*_tokens`).
The usage rows billed for a replica (`usage_events.replica_id`) should add up to them:

  final counters   the replica was stopped and counted on its way out: the billed
                   tokens must equal its counters, to the token
  last report      it still runs, or it died without a last count (killed, lost): its
                   counters are what it had finished at its last heartbeat, so the
                   bill must hold at least that much (calls may have ended since)
  never reported   it died before its first heartbeat: nothing to compare with

A replica that served calls cut by the control plane's own death (their rows are
`recovered` from the call journal at the next start, billed what their clients were
delivered) may have served a few tokens more than it was billed: those it generated
after the last chunk the dead gateway delivered. Its bill must then stay within its
counters (never billed more than served); the difference is printed as CUT, not drift.

A usage row that names a replica with no lifetime is drift too (billed for a replica
nobody recorded). `compare` is the decision, over plain data; `load` reads it from
Postgres; `run` is the command.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

if TYPE_CHECKING:        # imported where used: `thawpool --help` need not load sqlalchemy
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from controlplane.store.tables import ReplicaLifetime

STOPPED = "stopped"         # drained and stopped by the pool, its counters read at the stop


@dataclass(frozen=True)
class Tokens:
    prompt: int = 0
    completion: int = 0

    def __add__(self, other: "Tokens") -> "Tokens":
        return Tokens(self.prompt + other.prompt, self.completion + other.completion)

    def covers(self, other: "Tokens") -> bool:
        return self.prompt >= other.prompt and self.completion >= other.completion

    def __str__(self) -> str:
        return f"{self.prompt}+{self.completion}"


@dataclass(frozen=True)
class ReplicaCount:
    """One replica lifetime and what its own counters last said."""
    replica_id: str
    revision_id: str
    tenant_id: str
    served: Optional[Tokens]        # None: it never reported
    final: bool                     # counted as it stopped; else as of its last heartbeat


@dataclass(frozen=True)
class Drift:
    replica_id: str
    revision_id: Optional[str]
    served: Optional[Tokens]
    billed: Tokens
    why: str


@dataclass(frozen=True)
class Cut:
    """A replica served more than billed, explained by calls cut by a control-plane death."""
    replica_id: str
    served: Tokens
    billed: Tokens
    calls: int                      # its recovered rows


@dataclass(frozen=True)
class Reconciliation:
    drift: tuple[Drift, ...]
    exact: int                      # replicas whose final counters equal their bill
    at_least: int                   # replicas billed at least their last report
    unreported: int                 # replicas that never reported a count
    cut: tuple[Cut, ...] = ()       # served more than billed only by cut calls

    @property
    def ok(self) -> bool:
        return not self.drift


def compare(counts: Sequence[ReplicaCount], billed: Mapping[str, Tokens],
            recovered: Mapping[str, int] = {}) -> Reconciliation:
    """Each replica's counters against the tokens billed for it (see the module doc);
    `recovered`: replica id -> its rows billed from the call journal."""
    drift: list[Drift] = []
    cut: list[Cut] = []
    exact = at_least = unreported = 0
    for count in counts:
        bill = billed.get(count.replica_id, Tokens())
        calls = recovered.get(count.replica_id, 0)
        if count.served is None:
            unreported += 1
        elif calls and bill != count.served and count.served.covers(bill):
            cut.append(Cut(count.replica_id, count.served, bill, calls))
        elif count.final and bill != count.served:
            drift.append(_drift(count, bill, "billed differs from the replica's final counters"))
        elif not bill.covers(count.served):
            drift.append(_drift(count, bill, "billed less than the replica had served at its last report"))
        elif count.final:
            exact += 1
        else:
            at_least += 1
    known = {c.replica_id for c in counts}
    for replica_id in sorted(set(billed) - known):
        drift.append(Drift(replica_id, None, None, billed[replica_id], "billed for a replica with no lifetime"))
    return Reconciliation(tuple(drift), exact, at_least, unreported, tuple(cut))


def _drift(count: ReplicaCount, bill: Tokens, why: str) -> Drift:
    return Drift(count.replica_id, count.revision_id, count.served, bill, why)


def render(result: Reconciliation) -> str:
    lines = [f"replicas: {result.exact} exact, {result.at_least} billed at least their last report, "
             f"{result.unreported} never reported, {len(result.cut)} with calls cut by a control-plane "
             f"restart; drift: {len(result.drift)}"]
    for c in result.cut:
        lines.append(f"CUT replica {c.replica_id}: served {c.served} billed {c.billed} (prompt+completion): "
                     f"{c.calls} calls cut by a control-plane restart, billed what their clients "
                     f"received; the rest was generated after the last delivery")
    for d in result.drift:
        lines.append(f"DRIFT replica {d.replica_id} revision {d.revision_id or '-'}: served "
                     f"{d.served if d.served is not None else '-'} billed {d.billed} "
                     f"(prompt+completion): {d.why}")
    return "\n".join(lines)


# ------------------------------------------------------------------ queries

async def load(sessions: async_sessionmaker[AsyncSession], start: datetime,
               end: datetime) -> tuple[list[ReplicaCount], dict[str, Tokens], dict[str, int]]:
    """Lifetimes that held GPUs in [start, end) with their counters, the tokens billed
    for each replica over its whole life or billed in the window, and its recovered rows."""
    from sqlalchemy import func, select

    from controlplane.store.tables import ReplicaLifetime, UsageEvent

    r, u = ReplicaLifetime, UsageEvent
    held = select(r).where(r.placed_at.is_not(None), r.placed_at < end,
                           func.coalesce(r.stopped_at, r.last_seen_at, r.placed_at) >= start)
    async with sessions() as session:
        lifetimes = list(await session.scalars(held))
        ids = [lt.replica_id for lt in lifetimes]
        in_window = (u.started_at >= start) & (u.started_at < end)
        billed_rows = await session.execute(
            select(u.replica_id, func.sum(u.prompt_tokens), func.sum(u.completion_tokens),
                   func.count().filter(u.recovered))
            .where(u.replica_id.is_not(None), u.replica_id.in_(ids) | in_window)
            .group_by(u.replica_id))
    counts = [ReplicaCount(lt.replica_id, lt.revision_id, lt.tenant_id, _served(lt),
                           lt.state == STOPPED) for lt in lifetimes]
    rows = [(rid, Tokens(int(p), int(c)), int(n)) for rid, p, c, n in billed_rows if rid is not None]
    return counts, {rid: t for rid, t, _ in rows}, {rid: n for rid, _, n in rows if n}


def _served(lifetime: ReplicaLifetime) -> Optional[Tokens]:
    prompt, completion = lifetime.served_prompt_tokens, lifetime.served_completion_tokens
    return None if prompt is None or completion is None else Tokens(prompt, completion)


async def reconcile(database_url: str, start: datetime, end: datetime) -> Reconciliation:
    from controlplane.db import create_db_engine, sessionmaker

    engine = create_db_engine(database_url)
    try:
        return compare(*await load(sessionmaker(engine), start, end))
    finally:
        await engine.dispose()


# ------------------------------------------------------------------ command

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="start", required=True, help="window start (ISO 8601, UTC when naive)")
    p.add_argument("--to", dest="end", required=True, help="window end, exclusive")
    p.add_argument("--database-url", default=None, help="Postgres (THAWPOOL_DATABASE_URL)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when nothing drifts, 1 when something does, 2 for bad arguments."""
    from controlplane.fields import timestamp
    from controlplane.store.errors import InvalidField
    from controlplane.settings import Settings

    url = args.database_url or Settings.from_env().database_url
    if not url:
        print("thawpool admin reconcile: pass --database-url or set THAWPOOL_DATABASE_URL", file=sys.stderr)
        return 2
    try:
        start, end = timestamp("from", args.start), timestamp("to", args.end)
    except InvalidField as exc:
        print(f"thawpool admin reconcile: {exc}", file=sys.stderr)
        return 2
    result = asyncio.run(reconcile(url, start, end))
    print(render(result))
    return 0 if result.ok else 1
