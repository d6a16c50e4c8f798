"""The throttling proxy in a Python process of its own, for benchmarks.

In the client's process the proxy's thread waits for the GIL whenever the client
computes (up to the 5 ms switch interval), longer than one 256 KiB read lasts at
80 MB/s, so a busy client would be throttled by more than the rate. Run apart, the
proxy paces on its own clock, as S3 does on its own machines.

    with ProxyProcess(s3.port, rate_bytes_per_s=80 * MB) as proxy:
        ... proxy.endpoint ...
    proxy.stats.connections        # known once it has stopped

    python -m tests.support.throttle_process UPSTREAM_PORT RATE_BYTES_PER_S [FIRST_BYTE_S]
        prints the port it listens on, serves until stdin closes, then prints its stats
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from tests.support.throttle_proxy import HOST, ProxyStats, ThrottleProxy

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.support.throttle_process"


class ProxyProcess:
    def __init__(self, upstream_port: int, rate_bytes_per_s: float, *, first_byte_latency_s: float = 0.0) -> None:
        self.args = [str(upstream_port), repr(float(rate_bytes_per_s)), repr(float(first_byte_latency_s))]
        self.process: Optional[subprocess.Popen[str]] = None
        self.port: Optional[int] = None
        self.stats = ProxyStats()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> "ProxyProcess":
        self.process = subprocess.Popen([sys.executable, "-m", MODULE, *self.args], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        listening = self.process.stdout.readline()     # "" if it died first
        if not listening.strip().isdigit():
            self.stop()
            raise RuntimeError(f"throttle proxy did not start: {listening!r}")
        self.port = int(listening)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Closing its stdin stops it; its last line is its stats."""
        proc, self.process = self.process, None
        if proc is None:
            return
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines = out.strip().splitlines()
        if proc.returncode == 0 and lines:
            self.stats = ProxyStats(**json.loads(lines[-1]))

    def __enter__(self) -> "ProxyProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> None:
    upstream_port, rate, first_byte_s = int(argv[0]), float(argv[1]), float(argv[2])
    proxy = ThrottleProxy(upstream_port, rate, first_byte_latency_s=first_byte_s).start()
    try:
        print(proxy.port, flush=True)
        sys.stdin.read()                                # until the parent closes it
    finally:
        proxy.stop()
    print(json.dumps(asdict(proxy.stats)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
