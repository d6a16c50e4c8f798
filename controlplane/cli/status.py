"""`thawpool status NAME [--watch]`: revisions, the traffic split and each replica's state,
with the cold-start stages timed.

The stage times come from the pool's own clock: each replica reports `since`, the UTC
time of its last transition, so a stage's length is the next stage's `since` minus its
own. `--watch` polls and keeps every stage it saw (pending, pulling, loading, ready), so
a cold start watched live shows how long each stage took.
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any, Callable, Optional

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from controlplane.cli.client import JSON
from controlplane.cli.output import Context, Output, Subcommands, command


def register(commands: Subcommands, flags: argparse.ArgumentParser) -> None:
    status = commands.add_parser("status", parents=[flags],
                                 help="revisions, traffic and replicas of a deployment")
    status.add_argument("name")
    status.add_argument("--watch", action="store_true", help="refresh live until Ctrl-C")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    status.add_argument("--until", default=None, metavar="STATE",
                        help="with --watch: stop once every revision taking traffic is STATE")
    status.add_argument("--timeout", type=float, default=None,
                        help="with --until: give up (exit 1) after this many seconds")
    status.set_defaults(func=command(cmd_status))


class StageLog:
    """Per replica, the states seen in order with the time each began."""

    def __init__(self) -> None:
        self.stages: dict[str, list[tuple[str, datetime]]] = {}

    def see(self, deployment: JSON) -> None:
        for replica in replicas_of(deployment):
            seen = self.stages.setdefault(replica["replica_id"], [])
            since = datetime.fromisoformat(replica["since"])
            if not seen or seen[-1][0] != replica["state"]:
                seen.append((replica["state"], since))

    def timeline(self, replica_id: str) -> str:
        seen = self.stages.get(replica_id, [])
        steps = [f"{state} {(nxt - began).total_seconds():.1f}s"
                 for (state, began), (_, nxt) in zip(seen, seen[1:])]
        return " > ".join([*steps, seen[-1][0]]) if seen else ""

    def as_json(self) -> dict[str, list[dict[str, str]]]:
        return {rid: [{"state": s, "since": t.isoformat()} for s, t in seen]
                for rid, seen in self.stages.items()}


def replicas_of(deployment: JSON) -> list[JSON]:
    return [{**replica, "revision": name}
            for name, status in (deployment.get("status") or {}).items()
            for replica in status.get("replicas", [])]


def cmd_status(ctx: Context) -> int:
    args, log = ctx.args, StageLog()
    with ctx.client() as client:
        def fetch() -> JSON:
            deployment = client.deployment(args.name)
            log.see(deployment)
            return deployment
        if not args.watch:
            deployment = fetch()
            ctx.out.result(deployment, lambda: ctx.out.console.print(render(deployment, log)))
            return 0
        return watch(ctx.out, fetch, log, args)


def watch(out: Output, fetch: Callable[[], JSON], log: StageLog,
          args: argparse.Namespace) -> int:
    """Refreshes until Ctrl-C, or until `--until` holds (0) or `--timeout` passes (1)."""
    deadline = time.monotonic() + args.timeout if args.timeout else None
    live = Live(console=out.console, auto_refresh=False) if _animated(out) else None
    shown: Optional[str] = None
    try:
        if live is not None:
            live.start()
        while True:
            deployment = fetch()
            shown = _show(out, live, deployment, log, shown)
            if args.until and _reached(deployment, args.until):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                out.note(f"status: {args.name} did not reach {args.until} in {args.timeout:g}s")
                return 1
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if live is not None:
            live.stop()


def _animated(out: Output) -> bool:
    return not out.json_mode and sys.stdout.isatty()


def _show(out: Output, live: Optional[Live], deployment: JSON, log: StageLog,
          shown: Optional[str]) -> str:
    """Redraws in place on a terminal; elsewhere prints a snapshot when anything changed."""
    fingerprint = repr([(r["replica_id"], r["state"]) for r in replicas_of(deployment)]
                       + [deployment["traffic"], _states(deployment)])
    if live is not None:
        live.update(render(deployment, log), refresh=True)
    elif fingerprint != shown:
        if out.json_mode:
            print(_json_line(deployment, log), flush=True)
        else:
            out.console.print(render(deployment, log))
    return fingerprint


def _json_line(deployment: JSON, log: StageLog) -> str:
    import json

    return json.dumps({**deployment, "stages": log.as_json()}, default=str)


def _states(deployment: JSON) -> dict[str, str]:
    status = deployment.get("status") or {}
    return {name: status[name]["state"] for name in deployment["traffic"] if name in status}


def _reached(deployment: JSON, state: str) -> bool:
    states = _states(deployment)
    return bool(states) and all(s == state for s in states.values())


def render(deployment: JSON, log: StageLog) -> Group:
    scaling = deployment["scaling"]
    head = Text(f"{deployment['name']}  min {scaling.get('min_replicas')} max "
                f"{scaling.get('max_replicas')} replicas, idle timeout "
                f"{scaling.get('idle_timeout_s')}s, {_sleep_tier(scaling)}, target concurrency "
                f"{scaling.get('target_concurrency')}", style="bold")
    return Group(head, _revisions(deployment), _replicas(deployment, log))


def _sleep_tier(scaling: JSON) -> str:
    sleep_s = scaling.get("sleep_timeout_s") or 0
    return f"then asleep {sleep_s}s" if sleep_s else "no sleep tier"


def _slots(replica: JSON) -> str:
    if replica["state"] == "sleeping":
        return "(given back)"           # a sleeper holds no GPU and bills none
    return ",".join(replica["slot_ids"])


def _revisions(deployment: JSON) -> Table:
    status: dict[str, Any] = deployment.get("status") or {}
    table = Table("revision", "traffic", "state", "replicas", "queued", "model",
                  "gpus", "memory", "weights", "last error", title="revisions", title_justify="left")
    for revision in deployment["revisions"]:
        rs = status.get(revision["name"], {})
        table.add_row(revision["name"], f"{deployment['traffic'].get(revision['name'], 0)}%",
                      rs.get("state", "?"), str(len(rs.get("replicas", []))),
                      str(rs.get("queued_requests", 0)), revision["model_uri"],
                      str(revision["resources"]["gpu_count"]),
                      f"{revision['resources']['gpu_memory_gb']} GB",
                      "cached" if rs.get("weights_cached") else "-", _last_error(rs))
    return table


def _last_error(revision_status: JSON) -> str:
    """The revision's last error, or its failed prefetch's (never fatal, but worth seeing)."""
    prefetch = revision_status.get("prefetch_error")
    return revision_status.get("last_error") or (f"prefetch: {prefetch}" if prefetch else "")


def _replicas(deployment: JSON, log: StageLog) -> Table:
    table = Table("replica", "revision", "state", "since", "in flight", "slots",
                  "cold start (stages seen)", title="replicas", title_justify="left")
    for replica in replicas_of(deployment):
        table.add_row(replica["replica_id"][:12], replica["revision"], replica["state"],
                      replica["since"][11:19], str(replica["in_flight"]),
                      _slots(replica), log.timeline(replica["replica_id"]))
    if not table.rows:
        table.add_row("-", "", "scaled to zero", "", "", "", "")
    return table
