"""The egress proxy of a sandboxed build (pool/egress.py): the index's hosts only, on real
sockets; and from inside a real build sandbox, the only way out."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pool.egress import EgressProxy, allowed_hosts, target_of
from pool.function_sandbox import EGRESS, EGRESS_SOCKET, FunctionSandboxes
from pool.settings import PoolSettings
from tests.support.local_index import local_index

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox needs root (no root here)")


def test_the_index_names_the_hosts_pypi_when_none():
    assert allowed_hosts("https://mirror.example:8443/simple/") == {("mirror.example", 8443)}
    assert allowed_hosts("http://127.0.0.1:9/simple") == {("127.0.0.1", 9)}
    assert allowed_hosts(None) == {("pypi.org", 443), ("files.pythonhosted.org", 443)}


def test_a_request_head_names_its_target():
    connect = target_of(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n")
    assert connect[:2] == ("CONNECT", ("pypi.org", 443))
    method, host, forward = target_of(b"GET http://Mirror:8080/simple/x/?a=1 HTTP/1.1\r\nHost: mirror\r\n\r\n")
    assert (method, host) == ("GET", ("mirror", 8080))
    assert forward.startswith(b"GET /simple/x/?a=1 HTTP/1.1\r\nHost: mirror")
    for bad in (b"GET /relative HTTP/1.1\r\n\r\n", b"GET file:///etc/passwd HTTP/1.1\r\n\r\n", b"nonsense\r\n\r\n"):
        with pytest.raises(ValueError):
            target_of(bad)


def ask(proxy: Path, head: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(proxy))
        sock.sendall(head)
        return sock.recv(4096)


def test_only_the_allowed_host_is_opened(tmp_path):
    (tmp_path / "www").mkdir()
    with local_index(tmp_path / "none", tmp_path / "www") as url, socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        allowed = allowed_hosts(url)
        (port,) = [p for _, p in allowed]
        proxy = EgressProxy(tmp_path / "proxy.sock", allowed)
        proxy.start()
        try:
            assert ask(proxy.socket, f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode()).startswith(b"HTTP/1.0 200")
            assert ask(proxy.socket, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()).startswith(
                b"HTTP/1.1 200 Connection established")
            elsewhere = other.getsockname()[1]
            for head in (f"CONNECT 127.0.0.1:{elsewhere} HTTP/1.1\r\n\r\n",
                         f"GET http://127.0.0.1:{elsewhere}/ HTTP/1.1\r\n\r\n",
                         "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n"):
                assert ask(proxy.socket, head.encode()).startswith(b"HTTP/1.1 403"), head
            assert ("127.0.0.1", elsewhere) in proxy.refused
        finally:
            proxy.close()


PROBE = """
import socket, sys, urllib.request
from pathlib import Path
from runtime.functions.env import through_egress
through_egress(Path(sys.argv[1]))
index, elsewhere = sys.argv[2], int(sys.argv[3])
print("index", urllib.request.urlopen(index, timeout=10).status)
try:
    urllib.request.urlopen(f"http://127.0.0.1:{elsewhere}/", timeout=10)
    print("proxied elsewhere")
except OSError as exc:
    print("proxy refused", getattr(exc, "code", exc))
try:
    socket.create_connection(("127.0.0.1", elsewhere), timeout=3).close()
    print("direct reached")
except OSError:
    print("direct refused")
"""


@needs_root
def test_inside_a_build_sandbox_the_proxy_is_the_only_way_out_and_leads_to_the_index(tmp_path):
    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path / "cache")
    sandboxes = FunctionSandboxes.from_settings(settings)
    assert sandboxes is not None and sandboxes.sandbox.check() is None
    (tmp_path / "www").mkdir()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "thawpool.toml").write_text("")
    with local_index(tmp_path / "none", tmp_path / "www") as url, socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        folder = sandboxes.egress_folder("probe-build")
        proxy = EgressProxy(folder / EGRESS_SOCKET, allowed_hosts(url))
        proxy.start()
        uid = sandboxes.uid("tenant-e")
        root = sandboxes.envs_root(uid)
        profile = sandboxes.build_profile(uid, package, root, folder)
        command = sandboxes.sandbox.command("probe-build", profile, [
            sys.executable, "-c", PROBE, str(EGRESS / EGRESS_SOCKET), url, str(other.getsockname()[1])])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                                  env={"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[2]),
                                       "HOME": "/tmp"})
        finally:
            proxy.close()
            sandboxes.sandbox.release("probe-build")
            sandboxes.remove_egress("probe-build")
    assert done.stdout.split("\n")[:3] == ["index 200", "proxy refused 403", "direct refused"], done.stderr
