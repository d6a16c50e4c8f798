"""A function revision's Python environment on the node, cached by its requirements' hash.

`python -m runtime.functions.env --package DIR --root ROOT` prints one JSON line,
`{"python": ".../bin/python", "cached": bool, "seconds": float}`. The pool runs it
as a child process during the cold start (its own timed stage): pip may run a
dependency's build code, which must never run in the pool's process.

The environment is a venv made `--without-pip` (fast) whose site-packages ends
with a `.pth` line naming the platform's site-packages: the tenant's pins come
first, and torch, numpy and safetensors (large, and built for this node's GPUs)
come from the platform instead of a download per revision. Requirements are
installed by `uv pip install` when `uv` is on PATH, else by the platform's own pip
(`pip --python VENV`). A package that ships a `wheels/` folder installs from it
only (`--no-index --find-links`): it deploys on a node without PyPI, and no name
of its can be taken from the index instead. The venv is built in a temporary
folder and renamed into place, so a half-built one is never used; builds of the
same hash are serialised by a lock file.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from spec.function_package import MANIFEST, FunctionPackage, parse_manifest
from wire.socket_forward import SocketForward

PLATFORM_PTH = "_thawpool_platform.pth"
INSTALL_TIMEOUT_S = 900


class EnvBuildFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Env:
    python: Path
    cached: bool
    seconds: float


def env_dir(root: Path, package: FunctionPackage, package_dir: Path) -> Path:
    """Keyed by the requirements and, where they come from the package's own wheels, by
    those wheels' bytes: a revision that ships other wheels under the same requirement
    lines gets a venv of its own, never the one built from the earlier wheels."""
    wheels = package_dir / "wheels"
    if not wheels.is_dir():
        return root / f"{package.requirements_hash}-i"
    return root / f"{package.requirements_hash}-w{wheels_digest(wheels)}"


def wheels_digest(wheels: Path) -> str:
    """A digest of the folder's files, by name and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in wheels.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(wheels)).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:16]


def prepare(package_dir: Path, root: Path) -> Env:
    started = time.perf_counter()
    package = parse_manifest((package_dir / MANIFEST).read_bytes())
    target = env_dir(root, package, package_dir)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)              # one build per hash on the node
        cached = _python(target).exists()
        if not cached:
            _build(target, package, package_dir)
    return Env(_python(target), cached, time.perf_counter() - started)


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _build(target: Path, package: FunctionPackage, package_dir: Path) -> None:
    staging = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    try:
        _run([sys.executable, "-m", "venv", "--without-pip", str(staging)], "python -m venv")
        _link_platform(staging)
        if package.requirements:
            _run(_install_command(staging, package, package_dir), "installing requirements")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _link_platform(venv: Path) -> None:
    """A .pth line per platform site-packages folder: appended after the venv's own."""
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    Path(purelib).mkdir(parents=True, exist_ok=True)
    (Path(purelib) / PLATFORM_PTH).write_text("\n".join(site.getsitepackages()) + "\n")


def _install_command(venv: Path, package: FunctionPackage, package_dir: Path) -> list[str]:
    uv = shutil.which("uv")
    base = ([uv, "pip", "install", "--python", str(_python(venv))] if uv else
            [sys.executable, "-m", "pip", "--python", str(_python(venv)), "install",
             "--no-input", "--disable-pip-version-check", "--quiet"])
    wheels = package_dir / "wheels"
    source = ["--no-index", "--find-links", str(wheels)] if wheels.is_dir() else []
    return [*base, *source, *package.requirements]


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvBuildFailed(f"{what}: timed out after {INSTALL_TIMEOUT_S}s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EnvBuildFailed(f"{what} failed ({done.returncode}): {' | '.join(tail)}")


def through_egress(socket: Path) -> str:
    """This process's (and its children's) HTTP proxy: a loopback port carried to the
    pool's egress proxy (pool/egress.py), the sandbox's only way out, which opens only the
    hosts granted (a build's: the index's; a function server's: its tenant's grant)."""
    proxy = f"http://127.0.0.1:{SocketForward('127.0.0.1', socket).start()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ[name] = proxy
    for name in ("NO_PROXY", "no_proxy"):
        os.environ.pop(name, None)
    return proxy


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m runtime.functions.env")
    p.add_argument("--package", required=True, type=Path)
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--egress-socket", type=Path, default=None,
                   help="reach the package index through this proxy socket only (a sandboxed build)")
    args = p.parse_args(argv)
    if args.egress_socket is not None:
        through_egress(args.egress_socket)
    try:
        env = prepare(args.package, args.root)
    except (EnvBuildFailed, ValueError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(1)
    print(json.dumps({"python": str(env.python), "cached": env.cached, "seconds": env.seconds}))


if __name__ == "__main__":
    main()
