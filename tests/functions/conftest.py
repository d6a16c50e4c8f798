"""Function packages and function_server processes for tests/functions.

`probe_package(**batching)` copies the probe package (tests/functions/packages/probe)
with its batching settings; `example_package` is the example text classifier, its
weights built once per session by its own build script. `FunctionProcess` is one
real `python -m runtime.functions.server`, stopped by PID.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from pool.processes import free_port
from tests.controlplane.support.servers import RuntimeProcess
from tests.controlplane.conftest import db_url, models_bucket  # noqa: F401 - shared fixtures

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "packages" / "probe"
EXAMPLE = ROOT / "examples" / "functions" / "text-classifier"
SECRET = "probe-secret"


@pytest.fixture(scope="session")
def probe_package(tmp_path_factory):
    def make(max_batch_size: int = 4, max_wait_ms: int = 60000, requirements: str = "[]",
             wheels: bool = False) -> Path:
        folder = tmp_path_factory.mktemp("probe")
        shutil.copytree(PROBE, folder, dirs_exist_ok=True)
        manifest = (folder / "thawpool.toml").read_text()
        manifest = manifest.replace("max_batch_size = 4", f"max_batch_size = {max_batch_size}")
        manifest = manifest.replace("max_wait_ms = 60000", f"max_wait_ms = {max_wait_ms}")
        manifest = manifest.replace("requirements = []", f"requirements = {requirements}")
        (folder / "thawpool.toml").write_text(manifest)
        if wheels:
            make_wheel(folder / "wheels", "tinydep", "0.1", "VALUE = 42\n")
        return folder
    return make


@pytest.fixture(scope="session")
def example_package(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("text-classifier")
    subprocess.run([sys.executable, str(EXAMPLE / "build.py"), str(out)], check=True,
                   capture_output=True, timeout=300)
    return out


def make_wheel(folder: Path, name: str, version: str, init: str) -> Path:
    """A pure-Python wheel by hand (no build backend, no index): one module `name`."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": init,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={_digest(text)},{len(text.encode())}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0)), text)   # the same bytes each time
    return wheel


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


class FunctionProcess(RuntimeProcess):
    """`python -m runtime.functions.server` on a package, with a secret; stop() by PID
    (RuntimeProcess's: SIGTERM to its group, then SIGKILL)."""

    def __init__(self, package: Path, log: Path, *extra: str, python: str = sys.executable,
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.headers = {"authorization": f"Bearer {SECRET}"}
        child_env = {**(env if env is not None else os.environ), "PYTHONPATH": str(ROOT),
                     "THAWPOOL_REPLICA_SECRET": SECRET}
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [python, "-m", "runtime.functions.server", "--package", str(package),
                 "--port", str(self.port), "--served-model-name", "probe", *extra],
                env=child_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, status: str = "ready", timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"function server exited {self.process.returncode}: {self.log.read_text()[-800:]}")
            try:
                body = httpx.get(f"{self.base_url}/health", headers=self.headers, timeout=2.0).json()
                if body["status"] == status:
                    return body
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        pytest.fail(f"function server not {status} in {timeout_s}s: {self.log.read_text()[-800:]}")
