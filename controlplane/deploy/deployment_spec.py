"""Strict validation of deployment bodies and of the model they name.

Every refusal is an `InvalidField` naming the field (a 422 at the API), but
`pricing`, which belongs to the operator's price book: a body that sets it is
`Forbidden` (403). Model URIs, the deployment's and a draft model's
(`engine.speculative.model`), are S3 folders checked by
`controlplane.deploy.model_sources` against what the tenant may read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from controlplane.fields import boolean, integer, number, obj, storable_json
from controlplane.deploy.fallback_spec import Fallback, parse_fallbacks
from controlplane.deploy.model_sources import parse_s3_uri
from controlplane.store.errors import Forbidden, InvalidField
from pool.api import FUNCTION_ARCHITECTURE, ModelInfo, ReplicaKind
from spec.architectures import SUPPORTED_ARCHITECTURES, engine_option_refusal   # the runtime's own list
from spec import engine_options
from spec.tensor_parallel import kv_heads_refusal

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SPECULATIVE_FIELDS = frozenset({"method", "k", "n", "model", "max_batch", "min_acceptance"})
CREATE_FIELDS = frozenset({"name", "kind", "model_uri", "resources", "scaling", "engine", "pricing",
                           "fallbacks"})
KINDS = ("model", "function")
PATCH_FIELDS = frozenset({"model_uri", "resources", "scaling", "engine", "pricing", "promote",
                          "fallbacks"})
PRICING_IS_THE_OPERATORS = ("prices are set by the operator in the price book, not by a "
                            "deployment (GET /v1/billing/prices shows yours)")
DRAFT_MODEL = "engine.speculative.model"


@dataclass(frozen=True)
class Resources:
    gpu_memory_gb: float = 1.0
    gpu_count: int = 1


# Requests one replica is given before the autoscaler adds another: a replica batches no
# more than this, and past it a deployment would pile one tenant's load onto a replica or
# two instead of scaling.
MAX_TARGET_CONCURRENCY = 1024


@dataclass(frozen=True)
class Scaling:
    min_replicas: int = 0
    max_replicas: int = 1
    target_concurrency: int = 8
    idle_timeout_s: float = 300.0
    # the sleep tier: idle replicas sleep this long (GPU released, weights in host memory)
    # before they stop; 0: they stop at once (a function's replicas always do)
    sleep_timeout_s: float = 0.0
    # the pool pulls a revision's weights into its node cache when it is deployed and on
    # each scale-up, before a request needs them: a cold start then downloads nothing
    prefetch: bool = False


@dataclass(frozen=True)
class RevisionConfig:
    """What an immutable revision fixes."""
    model_uri: str
    resources: Resources = Resources()
    engine: dict[str, Any] = field(default_factory=dict)
    kind: ReplicaKind = "model"     # fixed at create: every revision of a deployment is one kind

    @property
    def draft_model_uri(self) -> Optional[str]:
        """The speculative draft model's URI, when the engine names one."""
        speculative = self.engine.get("speculative") or {}
        model = speculative.get("model")
        return model if isinstance(model, str) else None


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    revision: RevisionConfig
    scaling: Scaling = Scaling()
    fallbacks: tuple[Fallback, ...] = ()


@dataclass(frozen=True)
class DeploymentPatch:
    """Only the parts given; None means unchanged."""
    model_uri: Optional[str] = None
    resources: Optional[dict[str, Any]] = None
    scaling: Optional[dict[str, Any]] = None
    engine: Optional[dict[str, Any]] = None
    promote: bool = True
    fallbacks: Optional[tuple[Fallback, ...]] = None   # the whole list, replaced ([] clears it)


def parse_create(body: Any) -> DeploymentSpec:
    body = _body(body, CREATE_FIELDS)
    for required in ("name", "model_uri"):
        if required not in body:
            raise InvalidField(required, "is required")
    name = body["name"]
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidField("name", "lowercase letters, digits and '-', 1-63 characters")
    kind = body.get("kind", "model")
    if kind not in KINDS:
        raise InvalidField("kind", "'model' (the default) or 'function'")
    revision = check_parallelism(RevisionConfig(
        model_uri=parse_model_uri(body["model_uri"]),
        resources=parse_resources(body.get("resources", {}), Resources()),
        engine=parse_engine(body.get("engine", {}), kind), kind=kind))
    return DeploymentSpec(name=name, revision=revision,
                          scaling=parse_scaling(body.get("scaling", {}), Scaling()),
                          fallbacks=parse_fallbacks(body.get("fallbacks", []), name))


def parse_patch(body: Any) -> DeploymentPatch:
    body = _body(body, PATCH_FIELDS)
    if not body:
        raise InvalidField("body", "nothing to change")
    promote = body.get("promote", True)
    if not isinstance(promote, bool):
        raise InvalidField("promote", "must be true or false")
    if "model_uri" in body:
        parse_model_uri(body["model_uri"])
    for name in ("resources", "scaling", "engine"):
        if name in body:
            obj(name, body[name], None)
    # the deployment's own name is checked against the list by the deployer, which knows it
    fallbacks = parse_fallbacks(body["fallbacks"], None) if "fallbacks" in body else None
    return DeploymentPatch(model_uri=body.get("model_uri"), resources=body.get("resources"),
                           scaling=body.get("scaling"), engine=body.get("engine"),
                           promote=promote, fallbacks=fallbacks)


def _body(value: Any, allowed: frozenset[str]) -> dict[str, Any]:
    """A deployment body of known fields; one that sets prices is refused (403)."""
    body = obj("body", value, allowed)
    if "pricing" in body:
        raise Forbidden("pricing", PRICING_IS_THE_OPERATORS, code="price_set_by_operator")
    return body


def parse_model_uri(value: Any, field_name: str = "model_uri") -> str:
    """A folder, `s3://bucket/prefix/`, or one GGUF file, `s3://bucket/path/model.gguf`
    (the pool imports it on the node), under the same path rules."""
    if isinstance(value, str) and value.endswith(".gguf"):
        return parse_s3_uri(field_name, value).rstrip("/")
    return parse_s3_uri(field_name, value)


def parse_resources(value: Any, base: Resources) -> Resources:
    value = obj("resources", value, {"gpu_memory_gb", "gpu_count"})
    memory = number("resources.gpu_memory_gb", value.get("gpu_memory_gb", base.gpu_memory_gb),
                    minimum=0.0, exclusive=True)
    count = integer("resources.gpu_count", value.get("gpu_count", base.gpu_count), minimum=1)
    return Resources(gpu_memory_gb=memory, gpu_count=count)


def parse_scaling(value: Any, base: Scaling) -> Scaling:
    value = obj("scaling", value, set(Scaling.__dataclass_fields__))
    scaling = Scaling(
        min_replicas=integer("scaling.min_replicas",
                             value.get("min_replicas", base.min_replicas), minimum=0),
        max_replicas=integer("scaling.max_replicas",
                             value.get("max_replicas", base.max_replicas), minimum=1),
        target_concurrency=_target_concurrency(
            value.get("target_concurrency", base.target_concurrency)),
        idle_timeout_s=number("scaling.idle_timeout_s",
                              value.get("idle_timeout_s", base.idle_timeout_s), minimum=0.0),
        sleep_timeout_s=number("scaling.sleep_timeout_s",
                               value.get("sleep_timeout_s", base.sleep_timeout_s), minimum=0.0),
        prefetch=boolean("scaling.prefetch", value.get("prefetch", base.prefetch)))
    if scaling.min_replicas > scaling.max_replicas:
        raise InvalidField("scaling.min_replicas", "must not exceed scaling.max_replicas")
    return scaling


def _target_concurrency(value: Any) -> int:
    target = integer("scaling.target_concurrency", value, minimum=1)
    if target > MAX_TARGET_CONCURRENCY:
        raise InvalidField("scaling.target_concurrency",
                           f"at most {MAX_TARGET_CONCURRENCY} requests per replica; for more "
                           "load, raise scaling.max_replicas")
    return target


def parse_engine(raw: Any, kind: str = "model") -> dict[str, Any]:
    """The engine options a tenant set, as given (null: not set), after the engine's own
    validation (spec/engine_options.py) of the ones a tenant may set; a refusal names
    `engine.<option>`."""
    value = {k: v for k, v in storable_json("engine", obj("engine", raw, None)).items() if v is not None}
    if kind == "function" and value:
        raise InvalidField("engine", "a function has no engine settings (batching is in its thawpool.toml)")
    if "speculative" in value:
        value["speculative"] = parse_speculative(value["speculative"])
    try:
        engine_options.parse(value, engine_options.TENANT_OPTIONS)
    except engine_options.InvalidOption as refusal:
        raise InvalidField(f"engine.{refusal.option}", refusal.reason) from None
    return value


def parse_speculative(value: Any) -> dict[str, Any]:
    """{"method": "ngram", "k", "n"} or {"method": "draft", "model": "s3://...", "k"}: a
    draft model is a model URI under the tenant's sources, never a path on a node."""
    spec = dict(obj("engine.speculative", value, SPECULATIVE_FIELDS))
    method = spec.get("method")
    if method not in ("ngram", "draft"):
        raise InvalidField("engine.speculative.method", "'ngram' or 'draft'")
    for name in ("k", "n", "max_batch"):
        if name in spec:
            integer(f"engine.speculative.{name}", spec[name], minimum=1, maximum=64)
    if "min_acceptance" in spec:
        number("engine.speculative.min_acceptance", spec["min_acceptance"], minimum=0.0)
    if method == "ngram" and "model" in spec:
        raise InvalidField(DRAFT_MODEL, "only the 'draft' method takes a model")
    if method == "draft":
        if not isinstance(spec.get("model"), str) or not spec["model"].startswith("s3://"):
            raise InvalidField(DRAFT_MODEL, "a model URI s3://bucket/prefix/ (a path on a "
                                            "node is never taken)")
        spec["model"] = parse_model_uri(spec["model"], DRAFT_MODEL)
    return spec


def patched_config(base: RevisionConfig, patch: DeploymentPatch) -> RevisionConfig:
    """The revision config a PATCH asks for (validated against the current one)."""
    return check_parallelism(RevisionConfig(
        model_uri=parse_model_uri(patch.model_uri) if patch.model_uri else base.model_uri,
        resources=(parse_resources(patch.resources, base.resources)
                   if patch.resources is not None else base.resources),
        engine=(parse_engine(_merge(base.engine, patch.engine), base.kind)
                if patch.engine is not None else base.engine), kind=base.kind))


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch: given keys replace, null removes."""
    merged = {**base, **change}
    return {k: v for k, v in merged.items() if v is not None}


def check_parallelism(revision: RevisionConfig) -> RevisionConfig:
    """A replica on N GPUs runs one tensor-parallel rank per GPU: the two must agree."""
    size = revision.engine.get("tensor_parallel_size")
    if size is not None and size != revision.resources.gpu_count:
        raise InvalidField("engine.tensor_parallel_size",
                           f"must equal resources.gpu_count ({revision.resources.gpu_count}): "
                           "a replica runs one rank per GPU")
    return revision


def check_model(info: ModelInfo, resources: Resources, field_name: str = "model_uri",
                engine: Optional[Mapping[str, Any]] = None) -> None:
    """The model in S3 is one thawpool's engine runs, with the engine options asked of it
    (tensor parallelism, int8), and a replica on `gpu_count` GPUs can split its attention
    heads (what `pool.inspect_model` read from config.json)."""
    if info.architecture == FUNCTION_ARCHITECTURE:
        raise InvalidField(field_name, "is a function package (thawpool.toml): deploy it with "
                                       "\"kind\": \"function\"")
    if info.architecture not in SUPPORTED_ARCHITECTURES:
        raise InvalidField(field_name,
                           f"unsupported architecture {info.architecture!r} in config.json; "
                           f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    engine = engine or {}
    refusal = engine_option_refusal(info.architecture, resources.gpu_count, engine.get("quantization"),
                                    int(engine.get("max_loras") or 0))
    if refusal is not None:
        option, why = refusal
        raise InvalidField("resources.gpu_count" if option == "tensor_parallel_size" else f"engine.{option}", why)
    _check_quantized(info, resources, engine)
    _check_heads(info, resources.gpu_count)


def _check_quantized(info: ModelInfo, resources: Resources, engine: Mapping[str, Any]) -> None:
    """What a checkpoint stored quantized does not run with (the runtime refuses the same,
    runtime/models/decoder.py): refused here, before a replica starts."""
    if not info.quantized_parameters:
        return
    if engine.get("quantization"):
        raise InvalidField("engine.quantization", "the checkpoint is quantized already; leave it unset")
    if engine.get("batch_invariant"):
        raise InvalidField("engine.batch_invariant", "float32 dense models only, not a quantized checkpoint")
    if resources.gpu_count > 1:
        raise InvalidField("resources.gpu_count", "a quantized checkpoint runs on one GPU")


def _check_heads(info: ModelInfo, gpu_count: int) -> None:
    """Tensor parallelism splits attention heads whole, gpu_count ways, and splits the KV
    heads or replicates one on each rank (spec/tensor_parallel.py); 0: config.json does
    not say, which cannot be split either."""
    if gpu_count == 1:
        return
    heads = info.num_attention_heads
    if heads <= 0 or heads % gpu_count:
        raise InvalidField("resources.gpu_count",
                           f"{gpu_count} does not divide the model's num_attention_heads ({heads}); "
                           "a replica on several GPUs splits the heads between them")
    refusal = kv_heads_refusal(info.num_key_value_heads, gpu_count)
    if refusal is not None:
        raise InvalidField("resources.gpu_count", refusal)
