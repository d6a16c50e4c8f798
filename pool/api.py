"""The seam between the control plane and the pool: plain data and protocols.

The control plane implements DesiredStateSource (reads its deployment tables)
and ReplicaEventSink (records replica lifetimes for GPU-second billing); the
pool implements `Pool` (pool.manager.PoolManager) and hands back a `Lease` on a
ready runtime replica. These protocols list everything either side calls: a
test double implements them whole, and mypy --strict checks both sides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Mapping, Optional, Protocol

from spec.engine_options import ChosenOptions


# what a revision's replica runs: an LLM (runtime.serve.server) or a function package
ReplicaKind = Literal["model", "function"]

@dataclass(frozen=True)
class S3Access:
    """Credentials that read a model source outside the platform's bucket: a tenant's own
    bucket, granted by an admin with its own keys. Objects read with them are cached
    apart from the platform's (`origin`); the secret never appears in a repr or a log."""
    access_key_id: str
    secret_access_key: str = field(repr=False)
    endpoint_url: Optional[str] = None       # None: the platform's S3 endpoint
    region: Optional[str] = None             # None: the platform's region

    @property
    def origin(self) -> str:
        return f"{self.endpoint_url or ''}|{self.access_key_id}"


@dataclass(frozen=True)
class TenantQuota:
    """What the operator lets one tenant hold in the pool at once (None: no limit).

    The control plane reads it from its quota tables and sends it with every revision;
    the pool enforces it: a replica that would take the tenant past `max_gpus` waits
    (its requests queue, then 429 with Retry-After) and never takes another tenant's
    GPU; past `max_queued_requests` waiting requests, acquire() raises QueueFull."""
    max_gpus: Optional[int] = None
    max_queued_requests: Optional[int] = None
    # "host:port" its function servers may reach (pool/egress.py); none by default
    egress: tuple[str, ...] = ()


@dataclass(frozen=True)
class PinnedObject:
    """One object of a revision's model as its deploy read it: a cold start that finds
    other bytes under the key (another ETag or size) refuses them, so what placement
    sized at deploy is what loads."""
    etag: str                      # without quotes
    size: int


# "s3://bucket/key" -> the object as deployed: every object under the model's URI (and a
# draft model's) when the revision was made
Pins = Mapping[str, PinnedObject]


@dataclass(frozen=True)
class RevisionSpec:
    """Desired state of one immutable revision."""
    revision_id: str
    deployment_id: str
    tenant_id: str
    model_uri: str                 # s3://bucket/prefix/
    gpu_memory_gb: float = 1.0
    gpu_count: int = 1
    min_replicas: int = 0
    max_replicas: int = 1
    target_concurrency: int = 8
    idle_timeout_s: float = 300.0
    engine: ChosenOptions = field(default_factory=ChosenOptions)   # the deploy's; the rest default
    quota: TenantQuota = TenantQuota()       # the tenant's, the same on all its revisions
    kind: ReplicaKind = "model"    # model: runtime.serve.server | function: runtime.functions.server
    # The sleep tier: an idle replica sleeps (process and host-memory weights kept, GPU
    # slots released, no GPU seconds) for this long before it stops; 0: it stops at once.
    sleep_timeout_s: float = 0.0
    # Prefetch (pool/weights/prefetch.py): the pool pulls the revision's weights into its cache
    # when the revision appears or changes, and on each scale-up, in the background.
    prefetch: bool = False
    # The objects its deploy read (ModelInfo.objects of the model and a draft model);
    # empty for a revision made before they were kept: then nothing is checked.
    pins: Pins = field(default_factory=dict)

    @property
    def shape(self) -> "ReplicaShape":
        return ReplicaShape(self.gpu_memory_gb, self.gpu_count, self.engine)


@dataclass(frozen=True)
class ReplicaShape:
    """What one replica of a revision asks of the slots: placement sizes it from this."""
    gpu_memory_gb: float
    gpu_count: int
    engine: ChosenOptions = field(default_factory=ChosenOptions)


@dataclass(frozen=True)
class ModelInfo:
    """What the pool reads from a model folder in S3 without downloading weights."""
    model_uri: str
    architecture: str
    weight_bytes: int              # at the checkpoint's dtype
    dtype: str
    num_parameters: int
    files: tuple[str, ...]
    # What placement needs to size int8 weights and the KV cache, and what the
    # control plane checks at deploy (tensor-parallel head split, edge validation).
    linear_parameters: int = 0     # parameters of *_proj.weight matrices (int8-quantizable)
    # A quantized checkpoint's quantized weights (config.json's quantization_config): the
    # elements of their tensors as stored, and the bytes they take once loaded, whatever
    # the engine's dtype (their other parameters load at it).
    quantized_parameters: int = 0
    quantized_bytes: int = 0
    # ... and what a deployment shows of it: {"format": "gguf", "kept": {type: tensors},
    # "widened": [tensors loaded as floats]} or the HF scheme ({"format": "awq", ...}); {}: floats
    quantization: Mapping[str, Any] = field(default_factory=dict)
    bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)
    num_hidden_layers: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    max_position_embeddings: int = 0
    num_attention_heads: int = 0
    vocab_size: int = 0
    hidden_size: int = 0           # with intermediate_size: what an adapter's shapes are checked by
    intermediate_size: int = 0     # (spec.lora_adapter.BaseDims)
    # A function package (architecture FUNCTION_ARCHITECTURE): its thawpool.toml as text,
    # which the control plane parses with the replica's own rules (spec.function_package).
    function_manifest: Optional[str] = None
    # Every object read under the URI ("s3://bucket/key" -> ETag and size): the revision
    # made from this keeps them (RevisionSpec.pins).
    objects: Pins = field(default_factory=dict)


FUNCTION_ARCHITECTURE = "thawpool-function"     # ModelInfo.architecture of a function package


@dataclass(frozen=True)
class AdapterRef:
    """A tenant's LoRA adapter, as a request on its base's revision names it: the pool
    loads it into the replica the request goes to, when that replica lacks it."""
    name: str                      # the replica's name for it (the adapter's id): the request's `model`
    uri: str                       # s3://bucket/prefix/ of its PEFT folder
    tenant_id: str                 # its owner, whose grant reads the bucket
    pins: Pins                     # its two objects as attached (spec.lora_adapter's file names)
    weight_bytes: int = 0


@dataclass(frozen=True)
class AdapterLoadTimings:
    """What a request waited for while its adapter was loaded into a warm replica."""
    download_s: float = 0.0        # S3 into the node's weight cache (0: a cache hit)
    downloaded_bytes: int = 0
    install_s: float = 0.0         # into the replica (PUT /admin/adapters/{name})
    total_s: float = 0.0           # the whole wait (a load another request began included)


@dataclass(frozen=True)
class AdapterInfo:
    """What the pool reads of a PEFT LoRA adapter folder in S3 without judging it: its two
    files (spec.lora_adapter.CONFIG_FILE and WEIGHTS_FILE), each read no further than the
    rules need. The control plane checks them with spec.lora_adapter against the base it
    attaches the adapter to, which the pool does not know."""
    adapter_uri: str
    config: bytes                  # adapter_config.json; at most MAX_CONFIG_BYTES + 1 of it
    # adapter_model.safetensors's first bytes: its 8-byte header length and, when that is a
    # length a header may have within the file, the header (spec.lora_adapter.check_header)
    header: bytes
    weight_bytes: int              # adapter_model.safetensors's size
    # both objects as read ("s3://bucket/key" -> ETag and size): the adapter keeps them
    objects: Pins = field(default_factory=dict)


@dataclass(frozen=True)
class ColdStartTimings:
    """Seconds per stage of the cold start a request waited for."""
    queue_s: float = 0.0
    placement_s: float = 0.0
    download_s: float = 0.0
    downloaded_bytes: int = 0      # what its pull fetched from S3 (0: all in the cache)
    env_s: float = 0.0             # a function's per-revision venv (0 when cached or a model)
    load_s: float = 0.0
    total_s: float = 0.0
    # inside load_s, the replica's own record (runtime/load/timings.py): `<stage>_s` for
    # process, import, kernels, config, weights, assemble, pack, kv_cache; other_s,
    # weights_gbps, total_s. Empty when the replica reported none.
    load_stages: Mapping[str, float] = field(default_factory=dict)
    # "cold_start", or "wake": a sleeping replica woken (runtime/core/sleep_mode.py); then
    # placement_s is the wait for its slots, load_s its time in waking and load_stages
    # the replica's wake stages (weights_s, kv_cache_s, other_s, total_s)
    kind: str = "cold_start"


@dataclass(frozen=True)
class ReplicaEvent:
    replica_id: str
    revision_id: str
    deployment_id: str
    tenant_id: str
    state: str                     # pending|pulling|loading|ready|draining|sleeping|waking|stopped|failed
    at: datetime                   # UTC
    gpu_count: int
    slot_ids: tuple[str, ...] = ()
    reason: Optional[str] = None
    # The kind of the slots it holds (pool.inventory.Slot.kind: cuda | cpu), on an event
    # that carries slot_ids; None on the others, or when the slots left the pool. The
    # control plane prices the platform's GPU time by it (its cost book).
    gpu_kind: Optional[str] = None
    # The replica's own counters of what it served in its life (runtime /stats), read as it
    # stops: set on a `stopped` event only, and None there when they could not be read. A
    # crashed replica's latest known counters are its last heartbeat's `tokens`.
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None


class PoolError(Exception):
    """Base of the errors acquire() raises; each maps to one HTTP status."""
    status = 503
    retry_after_s: Optional[float] = None


class NeverFits(PoolError):
    status = 422


class AdapterRefused(PoolError):
    """The replica refused the adapter's files (pool.api.AdapterRef): its reason."""
    status = 422


class AdapterLoadFailed(PoolError):
    """The adapter could not be brought to the replica (S3, the replica's answer)."""

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(PoolError):
    status = 429

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(PoolError):
    """No replica of the revision was ready within the acquire's timeout and the next one
    waits for its tenant's GPU quota (TenantQuota.max_gpus), not for the pool: 429."""
    status = 429

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ColdStartTimeout(PoolError):
    status = 503

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ColdStartFailed(PoolError):
    status = 503

    def __init__(self, reason: str, retry_after_s: float = 10.0):
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class ModelUnavailable(PoolError):
    """The model folder cannot be read (missing config/weights, bad header)."""
    status = 422

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ReplicaStatus:
    replica_id: str
    state: str
    slot_ids: tuple[str, ...]
    base_url: Optional[str]
    in_flight: int
    since: datetime                # UTC time of the last transition
    reason: Optional[str] = None


@dataclass(frozen=True)
class RevisionStatus:
    """What revision_status() answers; `state` is one word for the status page.

    state: unknown | scaled_to_zero | waiting_for_capacity | starting | waking | ready |
           failed | draining | sleeping
    """
    revision_id: str
    state: str
    replicas: tuple[ReplicaStatus, ...] = ()
    queued_requests: int = 0
    desired_replicas: int = 0
    last_error: Optional[str] = None
    # every file of its weights (and a draft model's) is in the pool's cache now, as its
    # latest prefetch or a live replica's pull left them; a prefetch that failed says why
    weights_cached: bool = False
    prefetch_error: Optional[str] = None


class DesiredStateSource(Protocol):
    async def revisions(self) -> list[RevisionSpec]: ...

    async def source_access(self, tenant_id: str, uri: str) -> Optional[S3Access]:
        """The credentials an admin granted `tenant_id` for the bucket `uri` lies in (its
        own bucket); None: read it with the platform's. Asked at every inspection and
        cold start, so a revoked or rotated grant takes effect at the next one."""
        ...


@dataclass(frozen=True)
class Heartbeat:
    """Every replica of this pool that holds slots now, sent every `heartbeat_s` and once
    right after start (after re-adoption).

    The sink stamps `at` as the last-seen time of these replicas' open lifetimes, and
    closes every other open lifetime at its own last-seen time: a replica that went away
    while nobody recorded it (a control-plane crash) is billed up to the last heartbeat
    that saw it, never past it, and never lost.

    `tokens`: replica id -> (prompt, completion) tokens it has served since its process
    started, as its own counters say (runtime /stats), for the listed replicas that
    answered in time."""
    at: datetime                   # UTC
    replica_ids: tuple[str, ...]
    tokens: Mapping[str, tuple[int, int]] = field(default_factory=dict)


class ReplicaEventSink(Protocol):
    """Replica lifetimes for GPU-second billing (the control plane's replica_lifetimes).

    A lifetime is billed from the first event that carries slot_ids (the replica holds its
    GPUs) to `stopped`/`failed`, or to its last heartbeat when the stop was never recorded.
    A `sleeping` event carries no slot_ids: the replica gave its GPUs back, and its billed
    span ends there; the `waking` event that follows carries them again and starts a new
    span. Heartbeats list only replicas that hold slots, so never a sleeper.
    The pool retries an event the sink fails to take, in order, until it is taken."""
    async def replica_changed(self, event: ReplicaEvent) -> None: ...

    async def heartbeat(self, beat: Heartbeat) -> None: ...


class Lease(Protocol):
    """One request's hold on a ready replica; release() is idempotent."""
    @property
    def base_url(self) -> str: ...            # http://HOST:PORT of a ready runtime.serve.server
    @property
    def replica_id(self) -> str: ...
    @property
    def revision_id(self) -> str: ...
    @property
    def queue_s(self) -> float: ...           # time spent waiting in the activator
    @property
    def cold_start(self) -> Optional[ColdStartTimings]: ...   # set when it waited for a thaw
    @property
    def headers(self) -> Mapping[str, str]: ...   # sent on every call to the replica (its secret)
    @property
    def adapter_load(self) -> Optional[AdapterLoadTimings]: ...   # set when it waited for one

    def release(self) -> None: ...            # give the replica back (first call counts)

    def mark_failed(self) -> None: ...        # broke mid-request: unrouted until checked; replaced if dead


class Pool(Protocol):
    """What the control plane calls on the pool (pool.manager.PoolManager)."""
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def inspect_model(self, model_uri: str, tenant_id: Optional[str] = None) -> ModelInfo:
        """config.json and the safetensors headers from S3, read with the tenant's grant
        for the bucket when it has one (DesiredStateSource.source_access);
        ModelUnavailable (-> 422)."""
        ...

    async def inspect_adapter(self, adapter_uri: str, tenant_id: Optional[str] = None) -> AdapterInfo:
        """adapter_config.json and the safetensors header of adapter_model.safetensors
        (a ranged GET for its length, then one for the header), read like inspect_model
        with the tenant's grant for the bucket; ModelUnavailable (-> 422) naming a missing
        file."""
        ...

    def check_fits(self, info: ModelInfo, shape: ReplicaShape) -> None:
        """NeverFits (-> 422) when no inventory could ever hold a replica of this shape."""
        ...

    async def acquire(self, spec: RevisionSpec, *, request_id: str, prefix_key: Optional[str],
                      prompt_tokens: int, timeout_s: float, adapter: Optional[AdapterRef] = None,
                      priority: int = 0) -> Lease:
        """A lease on a ready replica (one holding `adapter`, loaded into it first when it
        lacks it); QueueFull or QuotaExceeded (429), ColdStartTimeout, ColdStartFailed or
        AdapterLoadFailed (503), each with retry_after_s; AdapterRefused (422). While no
        replica is ready, requests wait by `priority` (wire/priority.py: lower first), then
        arrival; a full queue sheds its worst waiter (QueueFull) for a better newcomer."""
        ...

    def revision_status(self, revision_id: str) -> RevisionStatus: ...

    async def refresh(self) -> None:
        """Re-read the desired state now (after a deploy, patch, traffic change or delete)."""
        ...

    @property
    def sandbox(self) -> str:
        """"bwrap", or "off" where the operator let tenants' code run unconfined
        (THAWPOOL_SANDBOX=off): /readyz and the banner say which."""
        ...
