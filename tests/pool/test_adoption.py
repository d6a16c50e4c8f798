"""Re-adoption's pieces without a pool: the decision, the record, the local registry of
processes in the state dir, a process found again by PID, slots booked for an adopted
replica."""
from __future__ import annotations

import dataclasses
import os
import signal
import stat
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pool.adoption import (ADOPTED, Registration, ReplicaRecord, Verdict, adopted_replica, decide, record_for,
                           spec_fingerprint)
from pool.api import RevisionSpec
from pool.backends.local_state import ProcessEntry, ProcessRegistry
from pool.capacity import Capacity
from pool.inventory import Slot
from pool.placement import Placed
from pool.processes import RuntimeProcess, process_start_ticks
from pool.replica import ReplicaState
from pool.settings import GB, PoolSettings
from spec.engine_options import ChosenOptions

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPEC = RevisionSpec("rev-1", "dep", "ten", "s3://b/m/", gpu_memory_gb=0.5,
                    engine=ChosenOptions({"kv_cache_tokens": 64}))
SLOTS = {"n/cpu0", "n/cpu1"}


def record(spec: RevisionSpec = SPEC, **changes) -> ReplicaRecord:
    base = record_for(spec, "n", ["n/cpu0"], "rep-1", base_url="http://127.0.0.1:9", secret="s3cret",
                      registration=Registration(spec_fingerprint(spec), GB // 2), started_at=T0)
    return dataclasses.replace(base, **changes)


def test_the_fingerprint_is_what_a_replica_runs_not_how_its_revision_scales():
    scaled = dataclasses.replace(SPEC, min_replicas=2, max_replicas=5, idle_timeout_s=1, target_concurrency=1)
    assert spec_fingerprint(scaled) == spec_fingerprint(SPEC)
    for changed in (dict(model_uri="s3://b/other/"), dict(engine=ChosenOptions({"kv_cache_tokens": 128})),
                    dict(gpu_memory_gb=1.0), dict(gpu_count=2)):
        assert spec_fingerprint(dataclasses.replace(SPEC, **changed)) != spec_fingerprint(SPEC), changed


def test_each_survivor_is_adopted_stopped_or_forgotten():
    rec = record()
    assert decide(rec, alive=True, answers=True, wanted=SPEC, slot_ids=SLOTS) == (Verdict.ADOPT, ADOPTED)
    cases = [
        (dict(alive=False, answers=False, wanted=SPEC), Verdict.FORGET, "its process is gone"),
        (dict(alive=True, answers=True, wanted=None), Verdict.STOP, "revision rev-1 is no longer deployed"),
        (dict(alive=True, answers=True, wanted=dataclasses.replace(SPEC, engine=ChosenOptions({"kv_cache_tokens": 8}))),
         Verdict.STOP, "revision rev-1 now has another spec"),
        (dict(alive=True, answers=False, wanted=SPEC), Verdict.STOP, "does not answer with its secret"),
    ]
    for given, verdict, why in cases:
        got = decide(rec, slot_ids=SLOTS, **given)
        assert got[0] is verdict and why in got[1], (given, got)
    gone = decide(rec, alive=True, answers=True, wanted=SPEC, slot_ids={"n/cpu1"})
    assert gone == (Verdict.STOP, "its slot(s) n/cpu0 are not in the pool")


def test_a_record_survives_json_and_never_shows_its_secret():
    rec = record()
    assert ReplicaRecord.from_json(rec.to_json()) == rec
    assert "s3cret" not in repr(rec)
    with pytest.raises(ValueError, match="not a replica record"):
        ReplicaRecord.from_json({"replica_id": "x"})


def test_an_adopted_replica_is_ready_on_its_slots():
    replica = adopted_replica(record(), 5.0, T0)
    assert (replica.state, replica.slot_ids, replica.reason) == (ReplicaState.READY, ("n/cpu0",), ADOPTED)
    assert replica.created_at == T0 and replica.since == T0


def test_the_state_dir_holds_owner_only_files_and_one_pool(tmp_path):
    folder = tmp_path / "state" / "local"
    registry = ProcessRegistry(folder)
    registry.lock()
    entry = ProcessEntry(4242, 17, 8000, tmp_path / "r.log", record())
    registry.write(entry)
    registry.write(ProcessEntry(4343, None, 8001, tmp_path / "s.log"))      # a standby
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "4242.json").stat().st_mode) == 0o600
    (folder / "999.json").write_text("{torn")
    assert sorted(registry.entries(), key=lambda e: e.pid) == [
        entry, ProcessEntry(4343, None, 8001, tmp_path / "s.log")]
    assert not (folder / "999.json").exists(), "an unreadable record is dropped"
    with pytest.raises(RuntimeError, match="another pool is running on the state dir"):
        ProcessRegistry(folder).lock()
    registry.remove(4242)
    registry.unlock()
    other = ProcessRegistry(folder)
    other.lock()                                           # free once the first pool let go
    assert [e.pid for e in other.entries()] == [4343]
    other.unlock()


async def test_a_process_is_found_again_by_pid_and_start_time_and_stopped(tmp_path):
    child = RuntimeProcess.spawn([sys.executable, "-c", "import time; time.sleep(600)"], os.environ,
                                 tmp_path / "sleep.log")
    try:
        assert child.started is not None and child.started == process_start_ticks(child.pid)
        found = RuntimeProcess(child.pid, child.started, child.log_path)     # not our child
        assert found.is_alive() and found.exit_description() is None
        assert not RuntimeProcess(child.pid, child.started + 1, child.log_path).is_alive(), \
            "a PID now naming another process is not ours"
        await found.stop(5.0)
        assert not found.is_alive() and "exit status unknown" in found.exit_description()
        assert child.popen.wait(5) == -signal.SIGTERM
    finally:
        child.kill_now()
    assert process_start_ticks(child.pid) is None


async def test_an_adopted_replica_books_its_slots_before_anything_is_placed():
    capacity = Capacity(PoolSettings())
    await capacity.update([Slot(f"n/cpu{i}", "n", "cpu", GB) for i in range(2)])
    assert capacity.hold("rep-1", "ten", "n", ["n/cpu0"], GB // 4) == Placed("n", ("n/cpu0",), GB // 4)
    assert capacity.hold("rep-2", "ten", "n", ["n/cpu1"], None) == Placed("n", ("n/cpu1",), GB)
    assert [(s.slot_id, s.reserved_bytes) for s in capacity.states()] == [("n/cpu0", GB // 4), ("n/cpu1", GB)]
    assert capacity.gpus_held() == {"ten": 2}


def test_a_subprocess_of_a_dead_parent_is_still_found(tmp_path):
    """The shape of a control-plane crash: the process that spawned the runtime is gone,
    the runtime (its own session) lives on and is found by PID and start time."""
    script = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              "time.sleep(600)'], start_new_session=True, stdout=subprocess.DEVNULL, "
              "stderr=subprocess.DEVNULL); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    pid = int(out.stdout.strip())
    orphan = RuntimeProcess(pid, process_start_ticks(pid), Path(tmp_path / "none.log"))
    try:
        assert orphan.is_alive()
    finally:
        orphan.kill_now()
