"""A small real pool for control-plane tests: leases a fixed list of runtime servers.

It implements `pool.api.Pool` whole: inspect_model reads config.json and the
safetensors headers from the real S3 (pool.weights.inspection, as PoolManager does;
inspect_adapter an adapter's files, pool.weights.adapter_inspection),
check_fits compares the shape with one slot of `slot_memory_gb` x `slot_gpus`,
acquire leases the next server round robin. It records what the control plane
asked for, so tests can check that a refused request acquired nothing and that
each lease was released exactly once.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional

from pool.api import (AdapterInfo, AdapterLoadTimings, AdapterRef, ColdStartTimings, Lease, ModelInfo, NeverFits,
                      Pool, PoolError, ReplicaShape, RevisionSpec, RevisionStatus)
from pool.weights.adapter_inspection import inspect_adapter
from pool.weights.inspection import inspect_model


@dataclass
class StaticLease:
    """pool.api.Lease over one of the servers."""
    base_url: str
    replica_id: str
    revision_id: str
    queue_s: float = 0.0
    cold_start: Optional[ColdStartTimings] = None
    headers: Mapping[str, str] = field(default_factory=dict)   # the servers are open: no secret
    adapter_load: Optional[AdapterLoadTimings] = None
    released: int = 0
    failed: bool = False

    def release(self) -> None:
        self.released += 1

    def mark_failed(self) -> None:
        self.failed = True


@dataclass
class Acquired:
    spec: RevisionSpec
    request_id: str
    prefix_key: Optional[str]
    prompt_tokens: int
    timeout_s: float
    lease: StaticLease
    adapter: Optional[AdapterRef] = None
    priority: int = 0


@dataclass
class StaticPool:
    s3_endpoint: Optional[str]
    aws_access_key_id: Optional[str]
    aws_secret_access_key: Optional[str]
    base_urls: list[str] = field(default_factory=list)
    sandbox: str = "off"                     # its replicas are the tests' own processes
    slot_memory_gb: float = 16.0
    slot_gpus: int = 8
    refuse_with: Optional[PoolError] = None          # raise this from acquire() when set
    cold_start: Optional[ColdStartTimings] = None
    calls: list[Acquired] = field(default_factory=list)
    inspected: list[str] = field(default_factory=list)   # the URI of each inspect_* call
    # every S3 request its client made, as (operation, s3://bucket/key-or-prefix): what
    # the pool read, to show what it did not
    s3_requests: list[tuple[str, str]] = field(default_factory=list)
    inspect_delay_s: float = 0.0          # a slow S3, to make concurrent deploys overlap
    refreshes: int = 0
    hold: Optional[asyncio.Event] = None  # acquire() waits for it when set (a cold start)
    waiting: int = 0                      # acquire() calls waiting on `hold` now
    lease_headers: Mapping[str, str] = field(default_factory=dict)   # e.g. a function server's secret

    def __post_init__(self) -> None:
        self._next = itertools.cycle(range(len(self.base_urls)))
        self._stack = contextlib.AsyncExitStack()
        self._s3: Any = None

    async def start(self) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        self._s3 = await self._stack.enter_async_context(get_session().create_client(
            "s3", endpoint_url=self.s3_endpoint, region_name="us-east-1",
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            config=AioConfig(s3={"addressing_style": "path"})))
        self._s3.meta.events.register("before-parameter-build.s3", self._record_s3)

    def _record_s3(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        where = params.get("Key", params.get("Prefix", ""))
        self.s3_requests.append((model.name, f"s3://{params.get('Bucket', '')}/{where}"))

    async def stop(self) -> None:
        await self._stack.aclose()

    async def inspect_model(self, model_uri: str, tenant_id: Optional[str] = None) -> ModelInfo:
        self.inspected.append(model_uri)
        await asyncio.sleep(self.inspect_delay_s)
        return await inspect_model(self._s3, model_uri)

    async def inspect_adapter(self, adapter_uri: str, tenant_id: Optional[str] = None) -> AdapterInfo:
        self.inspected.append(adapter_uri)
        return await inspect_adapter(self._s3, adapter_uri)

    def check_fits(self, info: ModelInfo, shape: ReplicaShape) -> None:
        if shape.gpu_count > self.slot_gpus or shape.gpu_memory_gb > self.slot_memory_gb:
            raise NeverFits(f"{info.model_uri} can never be placed: {shape.gpu_count} x "
                            f"{shape.gpu_memory_gb} GB asked, {self.slot_gpus} x "
                            f"{self.slot_memory_gb} GB held")

    async def acquire(self, spec: RevisionSpec, *, request_id: str, prefix_key: Optional[str],
                      prompt_tokens: int, timeout_s: float,
                      adapter: Optional[AdapterRef] = None, priority: int = 0) -> StaticLease:
        if self.hold is not None:
            self.waiting += 1
            try:
                await self.hold.wait()
            finally:
                self.waiting -= 1
        if self.refuse_with is not None:
            raise self.refuse_with
        index = next(self._next)
        lease = StaticLease(self.base_urls[index], f"static-{index}", spec.revision_id,
                            queue_s=0.001, cold_start=self.cold_start, headers=self.lease_headers)
        self.calls.append(Acquired(spec, request_id, prefix_key, prompt_tokens, timeout_s, lease, adapter,
                                   priority))
        return lease

    def revision_status(self, revision_id: str) -> RevisionStatus:
        return RevisionStatus(revision_id, "ready" if self.base_urls else "scaled_to_zero")

    async def refresh(self) -> None:
        self.refreshes += 1


if TYPE_CHECKING:       # mypy holds both doubles to the protocols the gateway calls
    _pool: type[Pool] = StaticPool
    _lease: type[Lease] = StaticLease
