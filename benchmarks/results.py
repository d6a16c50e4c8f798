"""Each benchmark's report, kept with the machine and the moment it was measured on.

    if __name__ == "__main__":
        from benchmarks.results import recorded
        with recorded(__file__):
            main()

What the script prints to stdout inside the block still goes to the terminal, and
is also written to `benchmarks/results/<script name>.txt` under a header: the date
(UTC) and duration, the git commit and whether the tree was clean, the command line,
the CPU model and core counts from /proc/cpuinfo, the load average before and after (a
busy machine moves wall-clock figures), the GPU if torch sees one, and the Python and
torch versions. A run that raises writes nothing, so
the last good report stays; one that exits with a status (sys.exit) records it;
--help and argument errors write nothing.

Only a clean tree is recorded: a run over uncommitted changes (tracked or untracked
files; the reports in benchmarks/results/ themselves excepted), or one during which the
commit changed, prints as usual but writes no report, since no commit could reproduce
it. THAWPOOL_BENCH_ALLOW_DIRTY=1 records it anyway, its header marked DIRTY.
Figures quoted in the README come from these files.
"""
from __future__ import annotations

import contextlib
import io
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, TextIO

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]
ALLOW_DIRTY_ENV = "THAWPOOL_BENCH_ALLOW_DIRTY"


@dataclass(frozen=True)
class Checkout:
    """The commit a run measured and whether the tree matched it."""
    commit: str                      # "": not a git checkout (nothing to check)
    dirty: bool = False

    def describe(self) -> str:
        if not self.commit:
            return "unknown (not a git checkout)"
        if self.dirty:
            return f"{self.commit} DIRTY (uncommitted changes: no commit reproduces this run)"
        return f"{self.commit} (clean tree)"

    def spanning(self, later: "Checkout") -> "Checkout":
        """This checkout at a run's start and `later` at its end, as one."""
        return Checkout(self.commit, self.dirty or later.dirty or later.commit != self.commit)


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, terminal: TextIO):
        self.terminal = terminal
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.terminal.write(text)

    def flush(self) -> None:
        self.terminal.flush()

    def isatty(self) -> bool:
        return self.terminal.isatty()


@contextlib.contextmanager
def recorded(script: str, results_dir: Path = RESULTS) -> Iterator[None]:
    """Tee stdout for the block; on a normal end (or sys.exit) write the report file."""
    name = Path(script).stem
    started_at, started = datetime.now(timezone.utc), time.monotonic()
    load_before = _load()
    at_start = checkout()
    if at_start.dirty and not _dirty_allowed():
        print(f"[uncommitted changes: this run will not be recorded ({ALLOW_DIRTY_ENV}=1 records it, "
              "marked DIRTY)]", file=sys.stderr)
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    except SystemExit as exc:
        sys.stdout = tee.terminal
        _write(name, started_at, started, load_before, tee, results_dir, exc.code, at_start)
        raise
    except BaseException:
        sys.stdout = tee.terminal                # a failed run leaves the last report alone
        raise
    sys.stdout = tee.terminal
    _write(name, started_at, started, load_before, tee, results_dir, None, at_start)


def _write(name: str, started_at: datetime, started: float, load_before: str, tee: _Tee,
           results_dir: Path, status, at_start: Checkout) -> None:
    if not tee.copy.getvalue() or {"-h", "--help"} & set(sys.argv[1:]):
        return                                   # a usage error or --help: no report
    tree = at_start.spanning(checkout())
    if tree.dirty and not _dirty_allowed():
        print(f"[not recorded: the tree had uncommitted changes or its commit changed during the run; "
              f"commit and rerun, or set {ALLOW_DIRTY_ENV}=1]", file=sys.stderr)
        return
    header = machine_header(name, started_at, time.monotonic() - started, load_before, status,
                            tree=tree)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.txt"
    path.write_text(header + "\n" + tee.copy.getvalue())
    print(f"[results written to {_shown(path)}]", file=sys.stderr)


def machine_header(name: str, started_at: datetime, seconds: float, load_before: str,
                   status=None, script: Optional[str] = None, tree: Optional[Checkout] = None) -> str:
    """`script`: the program's path when it is not benchmarks/<name>.py; `tree`: the
    checkout the run measured (default: the one now)."""
    lines = [
        f"benchmark: {script or f'benchmarks/{name}.py'}",
        f"date:      {started_at.isoformat(timespec='seconds')} (took {seconds:.0f} s)",
        f"commit:    {(tree or checkout()).describe()}",
        f"command:   {' '.join([Path(sys.executable).name, *sys.argv])}",
        f"cpu:       {_cpu()}",
        f"load avg:  {load_before} before, {_load()} after (1, 5, 15 min)",
        f"gpu:       {_gpu()}",
        f"python:    {platform.python_version()}; {_torch()}",
    ]
    if status not in (None, 0):
        lines.append(f"exit:      {status}")
    return "".join(f"# {line}\n" for line in lines)


def _cpu() -> str:
    models, physical = [], set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    block: dict[str, str] = {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if block:
                models.append(block.get("model name", platform.processor() or "unknown"))
                physical.add((block.get("physical id"), block.get("core id")))
            block = {}
            continue
        key, _, value = line.partition(":")
        block[key.strip()] = value.strip()
    model = models[0] if models else (platform.processor() or "unknown")
    logical = os.cpu_count() or len(models)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    known = bool(physical) and all(None not in pair for pair in physical)
    cores = f"{len(physical)} physical cores, " if known else ""
    return f"{model}; {cores}{logical} logical CPUs, {usable} usable by this process"


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _gpu() -> str:
    torch = sys.modules.get("torch")          # only if the benchmark itself imported it
    if torch is None:
        return "not used (torch not imported)"
    if not torch.cuda.is_available():
        return "none (torch sees no CUDA device)"
    return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def _torch() -> str:
    torch = sys.modules.get("torch")
    return f"torch {torch.__version__}" if torch is not None else "torch not imported"


def checkout(root: Path = ROOT) -> Checkout:
    """HEAD, and whether any file but the reports differs from it (untracked ones too)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=normal", "--", ".",
                      f":(exclude){RESULTS.relative_to(ROOT)}")
    except (OSError, subprocess.CalledProcessError):
        return Checkout("")
    return Checkout(commit, bool(changes))


def _dirty_allowed() -> bool:
    return os.environ.get(ALLOW_DIRTY_ENV, "") not in ("", "0")


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
