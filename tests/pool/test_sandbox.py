"""The sandbox's parts without a server: command lines, uids, cgroup files, the seccomp
program, and one real bubblewrap run (tests/security runs hostile code in it)."""
from __future__ import annotations

import subprocess
import time
import uuid
import sys
from pathlib import Path

import pytest

from pool.cgroups import Cgroups, CgroupLimits
from pool.sandbox import Bind, Platform, ReplicaUids, Sandbox, SandboxProfile, TenantUids
from pool.seccomp import write_filter

ROOT = Path(__file__).resolve().parents[2]


def test_each_tenant_gets_its_own_uid_and_keeps_it(tmp_path):
    uids = TenantUids(tmp_path / "uids.json", 300_000)
    first = [uids.uid(t) for t in ("a", "b", "a", "c")]
    assert first == [300_000, 300_001, 300_000, 300_002]
    assert TenantUids(tmp_path / "uids.json", 300_000).uid("b") == 300_001      # kept in the file


def test_replica_uids_go_in_turn_passing_over_one_a_process_holds(tmp_path):
    uids = ReplicaUids(tmp_path / "turn", base=0, span=3)      # uid 0: this test's own process
    assert [uids.take() for _ in range(4)] == [1, 2, 1, 2]


def test_the_command_binds_only_what_the_profile_names(tmp_path):
    sandbox = Sandbox(tmp_path, Platform((Path("/root/.pyenv/versions/x"),)), cgroups=Cgroups(tmp_path / "none"))
    profile = SandboxProfile(200_007, (Bind(Path("/data/pkg/f"), Path("/srv/package/f")),
                                       Bind(Path("/data/run"), Path("/run/replica"), writable=True)),
                             CgroupLimits(None, 64, None), 1 << 20)
    command = sandbox.command("r1", profile, ["python", "-c", "pass"])
    assert command[:2] == ["/bin/sh", "-c"]
    script = command[2]
    assert "--unshare-net" in script and "--unshare-pid" in script and "--reuid=200007" in script
    assert "--ro-bind /data/pkg/f /srv/package/f" in script and "--bind /data/run /run/replica" in script
    assert "--chmod 0755 /root" in script and "--chmod 0755 /tmp " not in script
    assert "cgroup.procs" not in script                       # no cgroup root here: rlimits only
    networked = sandbox.command("r2", SandboxProfile(1, (), CgroupLimits(None, 64, None), 1, network=True), ["x"])
    assert "--unshare-net" not in networked[2] and "/etc/resolv.conf" in networked[2]


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_limits_are_written_and_removed(tmp_path, version):
    root = tmp_path / "cgroup"
    if version == 2:
        root.mkdir()
        (root / "cgroup.controllers").write_text("cpu memory pids io\n")
        (root / "cgroup.subtree_control").write_text("")
        (root / "thawpool").mkdir()
        (root / "thawpool" / "cgroup.subtree_control").write_text("")
        group = root / "thawpool" / "r1"
        group.mkdir()
        for name in ("pids.max", "memory.max", "cpu.max", "cgroup.procs"):
            (group / name).write_text("")
    else:
        for controller, files in {"memory": ("memory.limit_in_bytes",), "pids": ("pids.max",),
                                  "cpu": ("cpu.cfs_period_us", "cpu.cfs_quota_us")}.items():
            group = root / controller / "thawpool" / "r1"
            group.mkdir(parents=True)
            (root / controller / files[0]).write_text("")
            for name in (*files, "cgroup.procs"):
                (group / name).write_text("")
    cgroups = Cgroups(root)
    procs = cgroups.create("r1", CgroupLimits(512 << 20, 99, 1.5))
    if version == 2:
        assert procs == [root / "thawpool" / "r1" / "cgroup.procs"]
        group = root / "thawpool" / "r1"
        assert (group / "pids.max").read_text() == "99" and (group / "memory.max").read_text() == str(512 << 20)
        assert (group / "cpu.max").read_text() == "150000 100000"
        assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    else:
        assert len(procs) == 3
        assert (root / "pids" / "thawpool" / "r1" / "pids.max").read_text() == "99"
        assert (root / "memory" / "thawpool" / "r1" / "memory.limit_in_bytes").read_text() == str(512 << 20)
        assert (root / "cpu" / "thawpool" / "r1" / "cpu.cfs_quota_us").read_text() == "150000"
    assert Cgroups(tmp_path / "nothing").create("r1", CgroupLimits(None, 1, None)) == []


def test_the_seccomp_program_is_written(tmp_path):
    write_filter(tmp_path / "f.bpf")
    program = (tmp_path / "f.bpf").read_bytes()
    assert len(program) % 8 == 0 and len(program) // 8 > 40           # one sock_filter is 8 bytes


def test_a_real_sandbox_runs_python_as_the_tenant_with_nothing_of_the_host(tmp_path):
    sandbox = Sandbox(tmp_path / "state", Platform.of_this_interpreter(ROOT))
    problem = sandbox.check()
    if problem is not None:
        pytest.skip(f"no sandbox on this machine: {problem}")
    profile = SandboxProfile(sandbox.uids().uid("t"), (), CgroupLimits(None, 64, None), 1 << 20)
    code = "import os; print(os.getuid(), sorted(os.listdir('/')), os.path.exists(%r))" % str(tmp_path)
    done = subprocess.run(sandbox.command("t1", profile, [sys.executable, "-c", code]), capture_output=True,
                          text=True, timeout=60)
    sandbox.release("t1")
    assert done.returncode == 0, done.stderr
    uid, _, rest = done.stdout.strip().partition(" ")
    assert int(uid) == 200_000 and rest.endswith("False")             # the test's folder is not there


CHECK = """
import sys
from pathlib import Path
from pool.sandbox import Platform, Sandbox
print(Sandbox(Path(sys.argv[1]), Platform.of_this_interpreter(Path(sys.argv[2]))).check())
"""


def test_the_processes_of_a_node_check_the_sandbox_at_once(tmp_path):
    """Ray actors on one node each check it as they start: the checks must not trip on
    each other (one seccomp file, one state folder)."""
    if Sandbox(tmp_path / "first", Platform.of_this_interpreter(ROOT)).check() is not None:
        pytest.skip("no sandbox on this machine")
    checks = [subprocess.Popen([sys.executable, "-c", CHECK, str(tmp_path / "state"), str(ROOT)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True) for _ in range(16)]
    assert [c.communicate(timeout=120)[0].strip() for c in checks] == ["None"] * 16


def test_a_group_whose_process_is_still_exiting_is_removed_later():
    cgroups = Cgroups()
    name = f"test-{uuid.uuid4().hex[:8]}"
    procs = cgroups.create(name, CgroupLimits(64 << 20, 8, None))
    if not procs:
        pytest.skip("no writable cgroup hierarchy on this machine")
    joins = " && ".join(f"echo $$ > {p}" for p in procs)
    sleeper = subprocess.Popen(["/bin/sh", "-c", f"{joins} && exec sleep 60"])
    try:
        while not procs[0].read_text().strip():
            time.sleep(0.01)
        cgroups.remove(name)                                 # busy: kept for later
        assert procs[0].parent.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    cgroups.create(f"{name}-next", CgroupLimits(None, 8, None))     # the next create sweeps it
    cgroups.remove(f"{name}-next")
    assert not any(p.parent.exists() for p in procs)


def test_a_sandbox_whose_launcher_died_is_ended_and_a_live_one_is_kept(tmp_path):
    """The orphan stands in for the race a Ray actor killed as it launches can leave (its
    launcher gone before bwrap armed --die-with-parent): processes in a group, none of them
    a launcher. The same node's live sandbox is not touched."""
    sandbox = Sandbox(tmp_path / "state", Platform.of_this_interpreter(ROOT))
    problem = sandbox.check()
    if problem is not None or not sandbox.cgroups.version:
        pytest.skip(f"no sandbox with cgroups on this machine: {problem or 'no cgroup hierarchy'}")
    live, orphan = (f"test-{uuid.uuid4().hex[:8]}" for _ in range(2))
    profile = SandboxProfile(sandbox.uids().uid("t"), (), CgroupLimits(None, 64, None), 1 << 20)
    running = subprocess.Popen(sandbox.command(live, profile, ["/bin/sleep", "60"]))
    joins = " && ".join(f"echo $$ > {p}" for p in sandbox.cgroups.create(orphan, CgroupLimits(None, 8, None)))
    left = subprocess.Popen(["/bin/sh", "-c", f"{joins} && exec sleep 60"])    # no launcher left
    try:
        while len(sandbox.cgroups.members(live)) < 3 or not sandbox.cgroups.members(orphan):
            time.sleep(0.01)                                 # sh, bwrap, ...: all joined
        assert sandbox.sweep_orphans() == [orphan]
        assert left.wait(timeout=10) == -9
        assert running.poll() is None and live in sandbox.cgroups.names()
        assert orphan not in sandbox.cgroups.names()
    finally:
        for process in (running, left):
            process.kill()
            process.wait()
        sandbox.release(live)
        sandbox.release(orphan)
