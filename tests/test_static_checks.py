"""Static checks in `make test`: ruff over the whole tree, mypy --strict over the seams.

The seams (pool.api's Pool/Lease/Backend protocols, the gateway, the routes, wire/,
the runtime's request path) are listed in pyproject.toml's [tool.mypy] `files`; a
renamed method on one side of a Protocol fails here, not at run time.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_is_clean():
    result = run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_seams_is_clean():
    result = run("mypy", "--no-incremental", "--cache-dir", "/dev/null")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_mypy_catches_a_protocol_broken_on_one_side(tmp_path):
    """The negative case: a Pool whose acquire lost an argument does not type-check."""
    broken = tmp_path / "broken_pool.py"
    broken.write_text(
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
    result = run("mypy", "--strict", "--no-incremental", "--cache-dir", "/dev/null",
                 "--config-file", "/dev/null", str(broken))
    assert result.returncode == 1, result.stdout
    assert 'Incompatible types in assignment (expression has type "Half", variable has type ' \
        '"Pool")' in result.stdout, result.stdout
