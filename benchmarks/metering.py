"""Usage events per second into Postgres: the real write path vs one INSERT per event.

    .venv/bin/python benchmarks/metering.py [--events 50000] [--baseline-events 3000]

Starts its own EmbeddedPostgres in a temp dir and applies the migrations. The
write path is controlplane.billing.metering.UsageWriter (batched multi-row INSERT ...
ON CONFLICT DO NOTHING, one transaction per batch); the peer is the naive
path, one INSERT and one commit per event, measured in the same run. 2% of
the events are submitted twice; the row count proves none lost or doubled.
Postgres runs on this machine's disk with its default (durable) commit settings, so
the one-by-one peer is bound by fsync per commit; on RDS both paths pay a network
round trip as well. The report, with the machine's details, is also written to
benchmarks/results/metering.txt.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select, text  # noqa: E402
from sqlalchemy.dialects.postgresql import insert  # noqa: E402

from controlplane.db import create_db_engine, migrate  # noqa: E402
from controlplane.embedded import EmbeddedPostgres  # noqa: E402
from controlplane.billing.metering import UsageWriter  # noqa: E402
from controlplane.store.tables import UsageEvent  # noqa: E402
from controlplane.billing.outbox import Outbox  # noqa: E402
from tests.controlplane.support.usage import make_record  # noqa: E402

# The naive peer: one idempotent INSERT per event.
INSERT_USAGE = insert(UsageEvent.__table__).on_conflict_do_nothing(index_elements=["invocation_id"])


async def rows(engine) -> int:
    async with engine.connect() as conn:
        return await conn.scalar(select(func.count()).select_from(UsageEvent))


async def write_path(engine, outbox_dir: Path, events: int, batch_size: int) -> tuple[float, int]:
    records = [make_record() for _ in range(events)]
    replays = records[::50]                                   # 2% submitted twice
    # all events are submitted at once: a buffer that holds them measures the write path,
    # not the spill to the outbox that a full buffer triggers
    writer = UsageWriter(engine, Outbox(outbox_dir / "outbox.jsonl"), batch_size=batch_size,
                         flush_interval_s=0.005, buffer_max=len(records) + len(replays))
    await writer.start()
    started = time.perf_counter()
    for i, record in enumerate(records + replays):
        writer.submit(record)
        if i % 1000 == 999:
            await asyncio.sleep(0)                            # callers are other tasks
    await writer.stop()                                       # returns once all committed
    elapsed = time.perf_counter() - started
    assert writer.outbox.depth == 0, "nothing may be left in the outbox"
    return elapsed, events


async def one_by_one(engine, events: int) -> tuple[float, int]:
    records = [make_record() for _ in range(events)]
    started = time.perf_counter()
    for record in records:
        async with engine.begin() as conn:
            await conn.execute(INSERT_USAGE, record.row())
    return time.perf_counter() - started, events


async def run(args, pg: EmbeddedPostgres, workdir: Path) -> int:
    engine = create_db_engine(pg.url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("TRUNCATE usage_events"))
        base_s, base_n = await one_by_one(engine, args.baseline_events)
        assert await rows(engine) == base_n
        async with engine.begin() as conn:
            await conn.execute(text("TRUNCATE usage_events"))
        path_s, path_n = await write_path(engine, workdir, args.events, args.batch_size)
        counted = await rows(engine)
    finally:
        await engine.dispose()
    base_rate, path_rate = base_n / base_s, path_n / path_s
    print(f"one INSERT per event : {base_n:>7} events in {base_s:7.2f} s = {base_rate:9.0f} events/s")
    print(f"UsageWriter (batched): {path_n:>7} events in {path_s:7.2f} s = {path_rate:9.0f} events/s"
          f"  (+{path_n // 50} replayed duplicates)")
    print(f"ratio                : {path_rate / base_rate:.1f}x   (target >= 10x and >= 5000 events/s)")
    print(f"rows counted         : {counted} of {path_n} expected -> "
          f"{'none lost or doubled' if counted == path_n else 'MISMATCH'}")
    return 0 if counted == path_n else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--baseline-events", type=int, default=3_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="thawpool-bench-") as tmp:
        workdir = Path(tmp)
        pg = EmbeddedPostgres(workdir / "pg").start()
        try:
            migrate(pg.url)
            return asyncio.run(run(args, pg, workdir))
        finally:
            pg.stop()


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        sys.exit(main())
