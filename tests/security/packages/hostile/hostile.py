"""A hostile tenant's handler: ordinary file, process and socket calls, no exploit.

Each input names a probe; the answer is what the probe found. The tests
(tests/security/test_hostile_function.py) assert it found nothing of the node
or of other tenants.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MY_PIDS_CEILING = 8            # bwrap's init, this server, a child or two


class Hostile:
    def load(self, model_dir: str) -> None:
        self.package = Path(model_dir)

    def predict(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [getattr(self, f"probe_{item['probe']}")(**item.get("args", {})) for item in inputs]

    def probe_identity(self) -> dict[str, Any]:
        status = Path("/proc/self/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
                "cap_eff": fields["CapEff"].strip(), "cap_bnd": fields["CapBnd"].strip(),
                "no_new_privs": fields["NoNewPrivs"].strip(), "seccomp": fields["Seccomp"].strip()}

    def probe_processes(self) -> dict[str, Any]:
        """Every process this one can see, with what it can read of each."""
        seen = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            seen[entry.name] = {"cmdline": _read(entry / "cmdline"), "environ": _read(entry / "environ")}
        return {"pids": sorted(seen), "seen": seen}

    def probe_files(self, paths: list[str]) -> dict[str, Any]:
        """Which of paths exist here, and which can be read (files) or listed (folders)."""
        found = {}
        for path in paths:
            p = Path(path)
            if p.is_dir():
                found[path] = _listing(p)
            elif p.exists():
                found[path] = _read(p)
        return {"found": found}

    def probe_write(self, paths: list[str]) -> dict[str, Any]:
        written = []
        for path in paths:
            try:
                with open(path, "a") as out:
                    out.write("owned")
                written.append(path)
            except OSError:
                pass
        return {"written": written}

    def probe_connect(self, tcp: list[list[Any]], unix: list[str]) -> dict[str, Any]:
        """TCP ports on loopback and unix sockets: which ones answered a connect."""
        reached = []
        for host, port in tcp:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                reached.append(f"{host}:{port}")
            except OSError:
                pass
        for path in unix:
            try:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.settimeout(2)
                    sock.connect(path)
                reached.append(path)
            except OSError:
                pass
        return {"reached": reached}

    def probe_network(self) -> dict[str, Any]:
        """Interfaces and routes, read without sending a packet: the metadata service
        (169.254.169.254) and every other host are reachable only through a route."""
        interfaces = [line.split(":")[0].strip() for line in _read(Path("/proc/net/dev")).splitlines()[2:]]
        routes = _read(Path("/proc/net/route")).splitlines()[1:]
        return {"interfaces": interfaces, "routes": routes}

    def probe_fetch(self, url: str) -> dict[str, Any]:
        """An HTTP GET the ordinary way (urllib, with whatever proxy it was given)."""
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return {"status": answer.status}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code}
        except OSError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def probe_devices(self) -> dict[str, Any]:
        return {"gpu": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") or n.startswith("dri"))}

    def probe_syscalls(self) -> dict[str, Any]:
        """Calls a handler never needs: the errno each one got (0: it went through). Each
        runs in a child of its own and aims at nothing but the probe's own: a child to
        trace, a fresh folder to mount on (unmounted at once), so that a probe of an
        unconfined pool (the tests' negative control) harms nothing of the node."""
        return {name: _in_child(call) for name, call in SYSCALLS.items()}

    def probe_fork_bomb(self, tries: int) -> dict[str, Any]:
        """Children that sleep, forked until fork fails or `tries` are up; all reaped."""
        children = []
        refused = None
        for _ in range(tries):
            try:
                pid = os.fork()
            except OSError as exc:
                refused = errno.errorcode.get(exc.errno, str(exc.errno))
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        return {"forked": len(children), "refused": refused}

    def probe_memory(self, mb: int) -> dict[str, Any]:
        """A child that allocates and touches mb MB: how it ended."""
        code = f"b = bytearray({int(mb)} * 1024 * 1024)\nprint(len(b))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return {"returncode": done.returncode, "memory_error": "MemoryError" in done.stderr}


def _ptrace_own_child(libc: ctypes.CDLL) -> int:
    target = os.fork()
    if target == 0:
        time.sleep(30)
        os._exit(0)
    try:
        return libc.ptrace(16, target, 0, 0)                     # PTRACE_ATTACH
    finally:
        os.kill(target, 9)
        os.waitpid(target, 0)


def _mount_own_folder(libc: ctypes.CDLL) -> int:
    folder = tempfile.mkdtemp().encode()
    rc = libc.mount(b"none", folder, b"tmpfs", 0, None)
    if rc == 0:
        libc.umount2(folder, 2)                                  # MNT_DETACH
    return rc


SYSCALLS = {"ptrace_attach": _ptrace_own_child,
            "unshare_user": lambda libc: libc.unshare(0x10000000),
            "unshare_net": lambda libc: libc.unshare(0x40000000),
            "mount_tmpfs": _mount_own_folder,
            "keyctl": lambda libc: libc.syscall(250, 0, 0, 0, 0, 0),          # keyctl(GET_KEYRING_ID)
            "bpf": lambda libc: libc.syscall(321, 0, 0, 0),
            "perf_event_open": lambda libc: libc.syscall(298, 0, 0, -1, -1, 0)}


def _in_child(call: Any) -> int:
    """The errno the call got in a forked child (0: it went through)."""
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        ctypes.set_errno(0)
        rc = call(libc)
        os._exit(0 if rc >= 0 else min(ctypes.get_errno() or 255, 255))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _read(path: Path) -> str:
    try:
        return path.read_bytes()[:4096].decode(errors="replace")
    except OSError:
        return ""


def _listing(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))[:50]
    except OSError:
        return []
