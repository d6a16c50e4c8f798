"""PoolSettings: the one typed settings object of the pool, built once.

`PoolSettings.from_env()` is the only place in pool/ that reads the
environment; everything else receives the frozen object.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional

GB = 1024 ** 3
MB = 1024 ** 2
BACKENDS = ("local", "ray")
SANDBOXES = ("bwrap", "off")
KEEP_ALIVE = ("fixed", "learned")


@dataclass(frozen=True)
class PoolSettings:
    # inventory: "auto" probes CUDA (in a child process), else declared CPU slots
    accelerator: str = "auto"                  # auto | cuda | cpu
    # what the cost book prices this node's GPUs as; "": the type CUDA names (inventory.py)
    gpu_kind: str = ""
    cpu_slots: int = 2
    slot_memory_gb: float = 8.0
    node: str = "local"
    # placement
    kv_cache_tokens_default: int = 4096        # when engine kwargs give none
    memory_overhead_fraction: float = 0.10     # activations, allocator slack
    # weights: S3 and the local content cache
    s3_endpoint: Optional[str] = None          # None: AWS default
    s3_region: str = "us-east-1"
    aws_access_key_id: Optional[str] = field(default=None, repr=False)      # kept out of
    aws_secret_access_key: Optional[str] = field(default=None, repr=False)  # logged reprs
    cache_dir: Path = field(default_factory=lambda: default_cache_dir(os.environ))
    cache_disk_budget_gb: float = 50.0
    # CPU replicas' packed layers (runtime/load/packed_weights.py) under cache_dir / "packed"; 0: none
    packed_cache_gb: float = 16.0
    part_size_mb: float = 8.0
    download_concurrency: int = 16
    verify_md5: bool = True
    s3_attempts: int = 5
    s3_backoff_base_s: float = 0.1
    s3_backoff_cap_s: float = 2.0
    s3_read_timeout_s: float = 30.0
    # stage timeouts: nothing stays in pulling or loading forever
    pull_timeout_s: float = 600.0
    load_timeout_s: float = 300.0
    stop_timeout_s: float = 5.0
    drain_timeout_s: float = 300.0
    # runtime processes
    warm_pool_size: int = 1
    # a standby taken is replaced this long after its load is done: the call that waited
    # for that load goes first (a standby's start is ~2 CPU-seconds; on a node of few
    # cores it slows the call), and the next cold start rarely comes sooner
    standby_refill_delay_s: float = 1.0
    runtime_python: str = sys.executable
    runtime_threads: Optional[int] = None      # OMP/torch threads per CPU replica
    host: str = "127.0.0.1"
    log_dir: Optional[Path] = None             # None: cache_dir / "logs"
    health_poll_s: float = 0.05
    # activator and control loop
    queue_limit: int = 64                      # per revision
    # LoRA adapters: how many one replica is given to hold in host memory (it swaps them
    # into its device slots itself), and one adapter's load into a replica at most
    adapters_per_replica: int = 64
    adapter_load_timeout_s: float = 60.0
    tick_s: float = 0.5
    desired_refresh_s: float = 5.0
    scale_down_delay_s: float = 30.0
    # "fixed": a revision's idle_timeout_s; "learned": keep-alive and pre-warm windows from
    # each revision's own idle times (pool/keep_alive.py), its idle_timeout_s until learned
    keep_alive: str = "fixed"
    # with learned windows: a revision's weights are pulled into the cache this long before
    # its window opens (pool/weights/prefetch.py), so the pre-warmed replica loads from it
    prefetch_lead_s: float = 60.0
    target_queued_prompt_tokens: int = 8192    # per replica; second scaling signal
    crash_backoff_base_s: float = 1.0
    crash_backoff_cap_s: float = 60.0
    # billing: replica events and heartbeats to the control plane's sink
    heartbeat_s: float = 15.0                  # every replica holding slots, listed this often
    event_queue_limit: int = 10000             # events the sink has not taken yet, at most
    event_retry_cap_s: float = 10.0            # a failing sink is retried with backoff up to this
    # re-adoption: what the pool's replicas need to be found again after a crash
    state_dir: Optional[Path] = None           # None: cache_dir / "state"
    # the sleep tier: host memory the weights of sleeping replicas may take on one node;
    # past it the oldest sleeper there is stopped (pool/sleep_budget.py)
    sleep_host_memory_gb: float = 32.0
    sleep_call_timeout_s: float = 120.0        # one /sleep or /wake call to a replica, at most
    # backend: local processes on this machine, or Ray actors across a cluster
    backend: str = "local"                     # local | ray
    ray_address: Optional[str] = None          # None: ray.init's default ("auto", RAY_ADDRESS)
    ray_replica_host: str = "127.0.0.1"        # runtime bind address on a node; 0.0.0.0: node IP
    ray_gpu_memory_gb: Optional[float] = None  # memory per Ray GPU; None: slot_memory_gb
    ray_namespace: str = "thawpool"            # the pool's named replica actors; one pool per namespace

    # the sandbox of every tenant process (pool/sandbox.py): "bwrap", or "off" for a
    # developer's machine, where functions then run unconfined (shown in the banner and /readyz)
    sandbox: str = "bwrap"
    sandbox_uid_base: int = 200_000            # tenants' uids are handed out from here
    sandbox_tmp_mb: int = 256                  # each sandbox's private /tmp
    sandbox_pids: int = 512                    # processes and threads of one sandboxed process tree
    sandbox_cpus: Optional[float] = None       # a CPU quota per sandboxed replica; None: none
    # the package index a function's requirements install from (none: pip's default);
    # the installer's own PIP_*/UV_* settings never reach a tenant's build
    function_index_url: Optional[str] = None

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, not {self.sandbox!r}")
        if self.keep_alive not in KEEP_ALIVE:
            raise ValueError(f"keep_alive must be one of {', '.join(KEEP_ALIVE)}, not {self.keep_alive!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")

    @property
    def part_size_bytes(self) -> int:
        return max(1, int(self.part_size_mb * MB))

    @property
    def cache_budget_bytes(self) -> int:
        return int(self.cache_disk_budget_gb * GB)

    @property
    def sleep_host_memory_bytes(self) -> int:
        return int(self.sleep_host_memory_gb * GB)

    @property
    def packed_dir(self) -> Path:
        return Path(self.cache_dir) / "packed"

    @property
    def logs(self) -> Path:
        return self.log_dir or Path(self.cache_dir) / "logs"

    @property
    def replica_state_dir(self) -> Path:
        """Where the local backend registers the processes it started (files 0600)."""
        return self.state_dir or Path(self.cache_dir) / "state"

    def with_(self, **changes: Any) -> "PoolSettings":
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **overrides: Any) -> "PoolSettings":
        """THAWPOOL_* variables (names are the field names upper-cased), then overrides."""
        values: dict[str, Any] = {}
        for name, f in cls.__dataclass_fields__.items():
            raw = env.get(f"THAWPOOL_{name.upper()}")
            if raw is not None:
                values[name] = _parse(raw, f.type)
        values.setdefault("cache_dir", default_cache_dir(env))
        values.setdefault("s3_endpoint", env.get("THAWPOOL_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL_S3"))
        values.setdefault("aws_access_key_id", env.get("AWS_ACCESS_KEY_ID"))
        values.setdefault("aws_secret_access_key", env.get("AWS_SECRET_ACCESS_KEY"))
        if env.get("AWS_DEFAULT_REGION"):
            values.setdefault("s3_region", env["AWS_DEFAULT_REGION"])
        values.update(overrides)
        return cls(**values)


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """The user's own cache ($XDG_CACHE_HOME/thawpool/pool, else ~/.cache/thawpool/pool),
    never the shared temp folder, where another user could read tenants' weights or
    plant an entry before the pool makes it; the weight cache creates it 0700."""
    base = env.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"   # XDG: absolute only
    return root / "thawpool" / "pool"


def _parse(raw: str, type_name: object) -> Any:
    kind = str(type_name)
    if "Optional" in kind and not raw.strip():      # an empty variable means "not set"
        return None
    if "bool" in kind:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if "Path" in kind:
        return Path(raw)
    if "int" in kind and "Optional" not in kind:
        return int(raw)
    if "float" in kind:
        return float(raw)
    if kind == "Optional[int]":
        return int(raw)
    return raw
