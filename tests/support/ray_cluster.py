"""One real multi-node Ray cluster per test session, on loopback only (the fixtures
`ray_cluster` and `cluster`, registered for every test folder by tests/conftest.py: the
Ray backend's tests and the hostile tenant's on Ray share one cluster).

Recipe 1 of ../shared/notes/ray-on-loopback.md: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
before `import ray` (node-IP detection then answers 127.0.0.1), every node at
127.0.0.1, no dashboard, Ray's files under one short temporary folder. A head
with no CPUs or GPUs and two worker nodes with 2 CPUs and 2 fake GPUs each;
each worker node has its own weight cache folder (THAWPOOL_CACHE_DIR in its
raylet's environment, which its workers inherit).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

GPUS_PER_NODE = 2
# Fast node-death detection: a removed node is declared dead after ~5 missed
# health checks of 1 s (Ray's default is 5 x 3 s), loose enough for a busy machine.
HEAD_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


@dataclass
class LoopbackCluster:
    cluster: object
    root: Path
    workers: list = field(default_factory=list)
    added: int = 0

    def add_worker(self):
        self.added += 1
        cache = self.root / f"node{self.added}-cache"
        node = self.cluster.add_node(node_ip_address="127.0.0.1", num_cpus=2, num_gpus=GPUS_PER_NODE,
                                     env_vars={"THAWPOOL_CACHE_DIR": str(cache)})
        node.cache_dir = cache            # where this node's weight cache lives
        self.workers.append(node)
        return node

    def remove_worker(self, node) -> None:
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)

    def ensure_workers(self, count: int = 2) -> None:
        """Top up after a test that removed a node (tests run in any order)."""
        while len(self.workers) < count:
            self.add_worker()
        self.cluster.wait_for_nodes()

    def node_cache(self, node_id: str) -> Path:
        return next(n.cache_dir for n in self.workers if n.node_id == node_id)


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray not installed")
    from ray.cluster_utils import Cluster

    root = Path(tempfile.mkdtemp(prefix="tpray-", dir="/tmp"))   # Ray's socket paths must stay short
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(root)       # else Ray writes its address file under /tmp/ray
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        node_ip_address="127.0.0.1", num_cpus=0, num_gpus=0, include_dashboard=False,
        temp_dir=str(root / "ray"), _system_config=HEAD_SYSTEM_CONFIG))
    loopback = LoopbackCluster(cluster, root)
    try:
        loopback.ensure_workers(2)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", namespace="thawpool-tests",
                 log_to_driver=False)
        yield loopback
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(ray_cluster) -> LoopbackCluster:
    ray_cluster.ensure_workers(2)
    return ray_cluster
