"""Soak: the fault suite's faults at random under steady streaming load, for a while.

    .venv/bin/python benchmarks/soak.py [--duration 600] [--streams 16] [--seed 1]

Starts the fault suite's platform (tests/faults/stack.py: its own Postgres, SeaweedFS
S3 and `thawpool up` as separate processes) over a tiny random model, deploys it for
one tenant, thaws it with one call, and keeps `--streams` openai clients streaming
from then on. After a quiet start it breaks one thing at a time, at random, each
followed by a recovery gap: Postgres SIGKILLed (restarted 3 s later), Postgres
blackholed (SIGSTOP for 5 s), the control plane SIGKILLed and restarted on its data
dir (or the same with half a record left at the end of its outbox), the serving
replica SIGKILLed, S3 stopped for 5 s. The last part of the run is quiet again.

Printed: calls by status; the share of calls that failed (no 200, or a stream that
ended without a finish_reason) and their counts by reason (the HTTP status they were
refused with, or the client's error: a connection that failed or broke off, an error
event mid-stream), then by the fault they overlapped; usage events lost (a call that received tokens and has no
row) and doubled (a call with two rows); tokens received against tokens billed, the
calls cut by a control-plane kill among them (billed at the next start from the call
journal: B-CP-3 in docs/billing-guarantees.md); p50/p99 call latency before, during (a call that overlaps a
fault or the 5 s after it) and after the faults; `thawpool admin reconcile` over the
run. The report is also written to benchmarks/results/soak.txt. The peer of each
latency figure is the quiet phase before the faults, measured in the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import quantiles
from typing import Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.billing.outbox import frame, unframe  # noqa: E402
from tests.controlplane.support.postgres import frozen  # noqa: E402
from tests.faults.bill import reconcile, usage_rows  # noqa: E402
from tests.faults.stack import FaultStack, alive  # noqa: E402
from tests.faults.traffic import Call, Ledger, client, steady, stream_chat  # noqa: E402
from tests.support.model_factory import ModelSpec, make_model  # noqa: E402

TENANT = "soak"
RECOVERY_S = 5.0             # a call this long after a fault still counts as "during"
FAILURE_SLACK_S = 2.0        # a fault's effect may outlast its end by a retry or a reconnect


@dataclass
class Fault:
    name: str
    started: float           # time.monotonic()
    ended: float = 0.0


async def kill_postgres(stack: FaultStack) -> None:
    stack.kill_postgres()
    await asyncio.sleep(3)
    await asyncio.to_thread(stack.start_postgres)


async def blackhole_postgres(stack: FaultStack) -> None:
    with frozen(stack.pg):
        await asyncio.sleep(5)


async def kill_control_plane(stack: FaultStack, torn: bool = False) -> None:
    assert stack.plane is not None
    stack.remember_replicas()
    stack.plane.kill()
    if torn and stack.plane.outbox_path.exists() and stack.plane.outbox_path.read_bytes():
        _tear(stack.plane.outbox_path)
    await asyncio.to_thread(stack.plane.start)


async def kill_replica(stack: FaultStack) -> None:
    assert stack.plane is not None
    for pid, replica_id in stack.plane.replica_pids().items():
        if replica_id is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
            return


async def stop_s3(stack: FaultStack) -> None:
    stack.stop_s3()
    await asyncio.sleep(5)
    await asyncio.to_thread(stack.start_s3)


def _tear(path: Path) -> None:
    """Half of one more framed record at the end, as a crash mid-append leaves it."""
    last = path.read_bytes().splitlines()[-1]
    payload = unframe(last)
    if payload is None:
        return
    record = json.loads(payload)
    record.update(invocation_id="torn" + record["invocation_id"][4:], request_id="soak-torn-record")
    whole = frame(json.dumps(record).encode())
    with open(path, "ab") as out:
        out.write(whole[: len(whole) // 2])


FAULTS: dict[str, Callable[[FaultStack], Awaitable[None]]] = {
    "postgres SIGKILL": kill_postgres,
    "postgres blackholed": blackhole_postgres,
    "control plane SIGKILL": kill_control_plane,
    "control plane SIGKILL + torn outbox": lambda s: kill_control_plane(s, torn=True),
    "replica SIGKILL": kill_replica,
    "S3 stopped": stop_s3,
}


async def break_things(stack: FaultStack, rng: random.Random, t0: float, until: float) -> list[Fault]:
    """One fault at a time, at random, each followed by a recovery gap, until `until`."""
    done: list[Fault] = []
    while time.monotonic() < until:
        name = rng.choice(sorted(FAULTS))
        fault = Fault(name, time.monotonic())
        print(f"  {fault.started - t0:6.1f}s  {name}", flush=True)
        await FAULTS[name](stack)
        fault.ended = time.monotonic()
        done.append(fault)
        await asyncio.sleep(rng.uniform(RECOVERY_S, 2 * RECOVERY_S))
    return done


def phase(call: Call, faults: list[Fault], t0: float) -> str:
    end = call.started + call.latency_s
    if call.started < t0:
        return "thaw"
    if not faults or end < faults[0].started:
        return "before"
    if any(call.started <= f.ended + RECOVERY_S and end >= f.started for f in faults):
        return "during"
    return "after" if call.started > faults[-1].ended + RECOVERY_S else "between"


def percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return f"n={len(values)}"
    cuts = quantiles(values, n=100)
    return f"n={len(values):5d}  p50 {cuts[49] * 1000:7.0f} ms  p99 {cuts[98] * 1000:7.0f} ms"


async def soak(args: argparse.Namespace, root: Path) -> int:
    rng = random.Random(args.seed)
    model = make_model(root / "model", ModelSpec())
    stack = FaultStack(root / "stack")
    try:
        await asyncio.to_thread(stack.start)
        uri = stack.upload(model, "soak")
        key = stack.tenant_key(TENANT)
        stack.deploy(key, TENANT, uri, max_replicas=1, target_concurrency=4 * args.streams)
        api, ledger, stop = client(stack.base_url, key), Ledger(), asyncio.Event()
        wall_start = datetime.now(timezone.utc)
        await stream_chat(api, ledger, TENANT, TENANT, args.max_tokens)   # the thaw, before the clock
        t0 = time.monotonic()
        load = asyncio.create_task(steady(api, ledger, TENANT, TENANT, args.max_tokens, args.streams, stop))
        quiet = max(10.0, args.duration * 0.15)
        await asyncio.sleep(quiet)
        faults = await break_things(stack, rng, t0, t0 + args.duration - quiet)
        await asyncio.sleep(max(0.0, t0 + args.duration - time.monotonic()))
        stop.set()
        await load
        return await report(stack, ledger, faults, wall_start, t0)
    finally:
        await asyncio.to_thread(stack.close)


async def report(stack: FaultStack, ledger: Ledger, faults: list[Fault], since: datetime, t0: float) -> int:
    rows = await _settled(stack, ledger)
    by_id: dict[str, int] = {}
    for row in rows:
        by_id[row["request_id"]] = by_id.get(row["request_id"], 0) + 1
    owed = [c for c in ledger.calls if c.prompt_tokens or c.completion_tokens]
    lost = [c for c in owed if c.request_id not in by_id]
    doubled = [rid for rid, n in by_id.items() if n > 1]
    billed = sum(r["completion_tokens"] for r in rows)
    received = sum(c.completion_tokens for c in ledger.calls)
    recovered = [r for r in rows if r["recovered"]]
    print(f"faults: {len(faults)} ({', '.join(sorted({f.name for f in faults})) or 'none'})")
    print(f"calls: {len(ledger.calls)}  by status: {dict(sorted(ledger.by_status().items()))}")
    print(failures_by_reason(ledger.calls))
    print(_failures_by_fault(ledger, faults))
    print(f"usage events lost: {len(lost)}   doubled: {len(doubled)}")
    for call in lost:
        print(_describe(call, faults))
    print(f"completion tokens received {received}, billed {billed} (of which {len(recovered)} calls cut by "
          f"a control-plane kill, billed {sum(r['completion_tokens'] for r in recovered)} tokens "
          f"from the call journal at the next start; B-CP-3)")
    print("latency of calls answered in full:")
    for name in ("before", "during", "after"):
        latencies = [c.latency_s for c in ledger.calls if c.finished and phase(c, faults, t0) == name]
        print(f"  {name:7s} {percentiles(latencies)}")
    code, out = reconcile(stack.pg.url, since, datetime.now(timezone.utc))
    print("thawpool admin reconcile:", out.strip().replace("\n", "\n  "))
    return 0 if not lost and not doubled and billed == received else 1


def failed(call: Call) -> bool:
    return call.status != 200 or not call.finished


def reason(call: Call) -> str:
    """Why a failed call failed, as its client saw it."""
    kind = (call.error or "").split(":", 1)[0]
    if call.status == 200:
        return "200, stream ended without a finish_reason"
    if call.status == 0:
        return f"connection failed or cut ({kind or 'no error'})"
    if kind == "Error code":                        # openai's APIStatusError: the answer's status
        return f"HTTP {call.status}"
    return f"error event mid-stream ({kind or 'no error'})"


def failures_by_reason(calls: list[Call]) -> str:
    """The share of calls that failed, and how many for each reason, most first."""
    reasons = Counter(reason(c) for c in calls if failed(c))
    count = sum(reasons.values())
    share = count / len(calls) if calls else 0.0
    by_reason = "; ".join(f"{n} {why}" for why, n in reasons.most_common()) or "none"
    return f"failed calls: {count} of {len(calls)} ({share:.2%}); by reason: {by_reason}"


def _failures_by_fault(ledger: Ledger, faults: list[Fault]) -> str:
    """Each failed call against the faults it overlapped: a failure no fault explains is
    listed by request id."""
    explained: dict[str, int] = {}
    unexplained: list[Call] = []
    for call in ledger.calls:
        if not failed(call):
            continue
        end = call.started + call.latency_s
        hit = [f.name for f in faults if call.started <= f.ended + FAILURE_SLACK_S and end >= f.started]
        if hit:
            explained[hit[-1]] = explained.get(hit[-1], 0) + 1
        else:
            unexplained.append(call)
    lines = [f"failed calls by the fault they overlapped: {dict(sorted(explained.items()))}; "
             f"overlapping none: {len(unexplained)}"]
    lines += [f"  unexplained: {c.request_id} status {c.status} {c.error}" for c in unexplained]
    return "\n".join(lines)


def _describe(call: Call, faults: list[Fault]) -> str:
    """A lost call against the nearest fault, to tell what lost it."""
    end = call.started + call.latency_s
    nearest = min(faults, key=lambda f: abs(f.started - end), default=None)
    where = f"; nearest fault {nearest.name} at {nearest.started - end:+.2f}s from its end" if nearest else ""
    return (f"  lost: {call.request_id} status {call.status} finished {call.finished} "
            f"tokens {call.prompt_tokens}+{call.completion_tokens}{where}")


async def _settled(stack: FaultStack, ledger: Ledger, timeout_s: float = 60.0) -> list:
    """The tenant's rows, once the outbox has had time to drain (or timeout_s passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await usage_rows(stack.pg.libpq_uri, TENANT)
        assert stack.plane is not None
        if stack.plane.outbox_records() == 0 and len(rows) >= sum(
                1 for c in ledger.calls if c.finished) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streaming clients")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="thawpool-soak-") as root:
        return asyncio.run(soak(args, Path(root)))


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        sys.exit(main())
