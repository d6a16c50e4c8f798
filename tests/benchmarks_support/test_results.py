"""benchmarks/results.py: a report names its commit and whether the tree was clean, and a
run over uncommitted changes is not recorded unless asked for, then marked DIRTY."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import results
from benchmarks.results import ALLOW_DIRTY_ENV, Checkout


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_a_checkout_is_dirty_with_any_change_but_the_reports(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "a.txt").write_text("old\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "first")
    assert not results.checkout(tmp_path).dirty
    (tmp_path / "benchmarks" / "results" / "a.txt").write_text("new figures\n")
    assert not results.checkout(tmp_path).dirty               # a report just written
    (tmp_path / "new_module.py").write_text("")
    assert results.checkout(tmp_path).dirty                   # untracked code counts
    assert "DIRTY" in results.checkout(tmp_path).describe()


def test_a_run_that_moved_to_another_commit_is_dirty():
    assert Checkout("a").spanning(Checkout("b")).dirty
    assert not Checkout("a").spanning(Checkout("a")).dirty
    assert Checkout("a").spanning(Checkout("a", dirty=True)).dirty


def _run(tmp_path: Path, monkeypatch, tree: Checkout) -> Path:
    monkeypatch.setattr(results, "checkout", lambda: tree)
    monkeypatch.setattr("sys.argv", ["bench.py"])
    with results.recorded("/x/bench.py", results_dir=tmp_path):
        print("figure 1.00x")
    return tmp_path / "bench.txt"


def test_a_dirty_run_is_not_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_DIRTY_ENV, raising=False)
    assert not _run(tmp_path, monkeypatch, Checkout("abc", dirty=True)).exists()
    report = _run(tmp_path, monkeypatch, Checkout("abc")).read_text()
    assert "# commit:    abc (clean tree)" in report and report.endswith("figure 1.00x\n")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_a_dirty_run_asked_for_is_marked(tmp_path, monkeypatch, value):
    monkeypatch.setenv(ALLOW_DIRTY_ENV, value)
    assert "# commit:    abc DIRTY" in _run(tmp_path, monkeypatch, Checkout("abc", dirty=True)).read_text()
