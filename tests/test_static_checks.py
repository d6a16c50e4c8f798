"""Static checks in `make test`: ruff over the whole tree, mypy --strict over the seams.

The seams (pool.api's Pool/Lease/Backend protocols, the gateway, the routes, wire/,
the runtime's request path) are listed in pyproject.toml's [tool.mypy] `files`; a
renamed method on one side of a Protocol fails here, not at run time.
"""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_is_clean():
    result = run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


BROKEN_POOL = (
    "from pool.api import Lease, ModelInfo, Pool, ReplicaShape, RevisionSpec, RevisionStatus\n"
    "class Half:\n"
    "    async def start(self) -> None: ...\n"
    "    async def stop(self) -> None: ...\n"
    "    async def inspect_model(self, model_uri: str) -> ModelInfo: ...\n"
    "    def check_fits(self, info: ModelInfo, shape: ReplicaShape) -> None: ...\n"
    "    async def acquire(self, spec: RevisionSpec) -> Lease: ...\n"
    "    def revision_status(self, revision_id: str) -> RevisionStatus: ...\n"
    "    async def refresh(self) -> None: ...\n"
    "pool: Pool = Half()\n")


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One mypy run (pyproject's settings: strict) over the configured seams and, beside
    them, a Pool whose acquire lost an argument: what both import is analysed once, where
    a run of its own for the negative case took ~10 s more."""
    broken = tmp_path_factory.mktemp("mypy") / "broken_pool.py"
    broken.write_text(BROKEN_POOL)
    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    return run("mypy", "--no-incremental", "--cache-dir", "/dev/null", *files, str(broken)), broken


def test_mypy_strict_on_the_seams_is_clean(mypy_run):
    result, broken = mypy_run
    assert result.returncode in (0, 1), result.stdout + result.stderr       # 2: mypy itself failed
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [e for e in errors if not e.startswith(str(broken))] == [], result.stdout + result.stderr


def test_mypy_catches_a_protocol_broken_on_one_side(mypy_run):
    """The negative case: the broken Pool does not type-check, in the same run."""
    result, broken = mypy_run
    assert result.returncode == 1, result.stdout + result.stderr
    assert f'{broken}:10: error: Incompatible types in assignment (expression has type "Half", variable has ' \
        'type "Pool")' in result.stdout, result.stdout
