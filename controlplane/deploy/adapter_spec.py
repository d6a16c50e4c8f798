"""Strict validation of adapter bodies, of the base they name and of the adapter read
from S3: pure rules, no I/O (the attach, controlplane.deploy.adapters, does the reads).

Every refusal is an `InvalidField` (a 422 at the API). The base's refusals name `base`;
the adapter's are spec.lora_adapter's own, naming the field they are about (`r`,
`target_modules`, `adapter_model.safetensors`, ...), so the API, the CLI and a replica
that loads the adapter refuse it in the same words.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any, Iterable

from controlplane.deploy.deployment_spec import NAME
from controlplane.deploy.model_sources import parse_s3_uri
from controlplane.fields import obj
from controlplane.store.deployments import kind_of
from controlplane.store.errors import InvalidField
from controlplane.store.tables import Deployment, Revision
from pool.api import AdapterInfo, ModelInfo
from spec import engine_options, lora_adapter
from spec.architectures import ARCHITECTURES, lora_refusal

FIELDS = ("name", "base", "adapter_uri")
NAME_RULE = "lowercase letters, digits and '-', 1-63 characters"


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    base: str                      # a deployment's name: the tenant's own, or a shared one
    adapter_uri: str               # s3://bucket/prefix/ of the PEFT folder


@dataclass(frozen=True)
class ServingRevision:
    """A revision of the base taking traffic, and the adapter rank its slots hold."""
    revision: Revision
    max_lora_rank: int


def parse_attach(body: Any) -> AdapterSpec:
    body = obj("body", body, set(FIELDS))
    for required in FIELDS:
        if required not in body:
            raise InvalidField(required, "is required")
    for field in ("name", "base"):
        if not isinstance(body[field], str) or not NAME.match(body[field]):
            raise InvalidField(field, NAME_RULE + ("" if field == "name" else " (a deployment's name)"))
    return AdapterSpec(body["name"], body["base"], parse_s3_uri("adapter_uri", body["adapter_uri"]))


def check_base(name: str, deployment: Deployment, revisions: list[Revision]) -> list[ServingRevision]:
    """The base's revisions taking traffic, once each can take adapters: a model, its
    engine given adapter slots (max_loras), on an architecture the adapters apply to, on
    one GPU (adapters run on one rank)."""
    if not revisions or kind_of(revisions[-1]) != "model":
        raise InvalidField("base", f"{name!r} is a function; adapters attach to a model deployment")
    serving = [r for r in revisions if deployment.traffic.get(r.name, 0) > 0]
    if not serving:
        raise InvalidField("base", f"{name!r} has no revision taking traffic")
    return [_check_revision(name, r) for r in serving]


def _check_revision(name: str, revision: Revision) -> ServingRevision:
    options = engine_options.parse(revision.engine)
    if options.max_loras < 1:
        raise InvalidField("base", f"{name!r} (revision {revision.name}) has no adapter slots: "
                                   "set its engine max_loras (e.g. PATCH the deployment with "
                                   "{\"engine\": {\"max_loras\": 4}}), then attach")
    if revision.architecture not in ARCHITECTURES:
        raise InvalidField("base", f"{name!r} runs {revision.architecture!r}, which takes no adapters")
    refusal = lora_refusal(revision.architecture)
    if refusal is not None:
        raise InvalidField("base", refusal)
    ranks = max(revision.gpu_count, options.tensor_parallel_size or 1)
    if ranks > 1:
        raise InvalidField("base", f"{name!r} (revision {revision.name}) runs on {ranks} GPUs; "
                                   "adapters run on one-GPU replicas (tensor_parallel_size 1)")
    return ServingRevision(revision, options.max_lora_rank)


def base_dims(model: ModelInfo) -> lora_adapter.BaseDims:
    """The sizes an adapter's tensors are checked against, from the base's config.json."""
    dims = lora_adapter.BaseDims(
        num_hidden_layers=model.num_hidden_layers, hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads, head_dim=model.head_dim)
    if min(astuple(dims)) < 1:
        raise InvalidField("base", "its model's config.json does not give the sizes an adapter "
                                   "is checked against (hidden_size, intermediate_size, heads)")
    return dims


def check_adapter(adapter: AdapterInfo, max_rank: int,
                  bases: Iterable[lora_adapter.BaseDims]) -> lora_adapter.AdapterSettings:
    """The adapter's settings, once its config and its tensors are what the engine applies
    to every one of `bases` at ranks up to `max_rank`."""
    try:
        settings = lora_adapter.parse_settings(adapter.config, max_rank)
        if adapter.weight_bytes > lora_adapter.MAX_WEIGHTS_BYTES:
            raise ValueError(f"{lora_adapter.WEIGHTS_FILE}: {adapter.weight_bytes} bytes, over the "
                             f"{lora_adapter.MAX_WEIGHTS_BYTES}-byte cap")
        for dims in bases:
            lora_adapter.check_header(adapter.header, settings, dims)
    except ValueError as exc:
        raise refusal_of(str(exc)) from None
    return settings


def refusal_of(message: str, default_field: str = "adapter_uri") -> InvalidField:
    """spec.lora_adapter's `field: why` (and the pool's `file: why`) as an InvalidField
    naming that field; a message of no field names `default_field`."""
    field, sep, why = message.partition(": ")
    if not sep or " " in field or "/" in field:
        return InvalidField(default_field, message)
    return InvalidField(field, why)
