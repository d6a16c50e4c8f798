"""Strict validation of deployment bodies and of the model they name.

Every refusal is an `InvalidField` naming the field (a 422 at the API).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Any, Optional

from controlplane.pricing import Pricing, parse_price
from controlplane.store.errors import InvalidField
from pool.api import ModelInfo

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<prefix>[^\s]+?)/?$")
SUPPORTED_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM",
                                     "Qwen2ForCausalLM"})
ENGINE_FIELDS = frozenset({"dtype", "kv_cache_tokens", "enable_prefix_caching", "speculative",
                           "quantization", "tensor_parallel_size", "max_num_seqs",
                           "max_num_batched_tokens", "max_model_len", "block_size", "seed"})
CREATE_FIELDS = frozenset({"name", "model_uri", "resources", "scaling", "engine", "pricing"})
PATCH_FIELDS = frozenset({"model_uri", "resources", "scaling", "engine", "pricing", "promote"})


@dataclass(frozen=True)
class Resources:
    gpu_memory_gb: float = 1.0
    gpu_count: int = 1


@dataclass(frozen=True)
class Scaling:
    min_replicas: int = 0
    max_replicas: int = 1
    target_concurrency: int = 8
    idle_timeout_s: float = 300.0


@dataclass(frozen=True)
class RevisionConfig:
    """What an immutable revision fixes."""
    model_uri: str
    resources: Resources = Resources()
    engine: dict[str, Any] = field(default_factory=dict)
    pricing: Pricing = Pricing()


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    revision: RevisionConfig
    scaling: Scaling = Scaling()


@dataclass(frozen=True)
class DeploymentPatch:
    """Only the parts given; None means unchanged."""
    model_uri: Optional[str] = None
    resources: Optional[dict[str, Any]] = None
    scaling: Optional[dict[str, Any]] = None
    engine: Optional[dict[str, Any]] = None
    pricing: Optional[dict[str, Any]] = None
    promote: bool = True


def parse_create(body: Any) -> DeploymentSpec:
    body = _object("body", body, CREATE_FIELDS)
    for required in ("name", "model_uri"):
        if required not in body:
            raise InvalidField(required, "is required")
    name = body["name"]
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidField("name", "lowercase letters, digits and '-', 1-63 characters")
    revision = check_parallelism(RevisionConfig(
        model_uri=parse_model_uri(body["model_uri"]),
        resources=parse_resources(body.get("resources", {}), Resources()),
        engine=parse_engine(body.get("engine", {})),
        pricing=parse_pricing(body.get("pricing", {}), Pricing())))
    return DeploymentSpec(name=name, revision=revision,
                          scaling=parse_scaling(body.get("scaling", {}), Scaling()))


def parse_patch(body: Any) -> DeploymentPatch:
    body = _object("body", body, PATCH_FIELDS)
    if not body:
        raise InvalidField("body", "nothing to change")
    promote = body.get("promote", True)
    if not isinstance(promote, bool):
        raise InvalidField("promote", "must be true or false")
    if "model_uri" in body:
        parse_model_uri(body["model_uri"])
    for name in ("resources", "scaling", "engine", "pricing"):
        if name in body:
            _object(name, body[name], None)
    return DeploymentPatch(model_uri=body.get("model_uri"), resources=body.get("resources"),
                           scaling=body.get("scaling"), engine=body.get("engine"),
                           pricing=body.get("pricing"), promote=promote)


def parse_model_uri(value: Any) -> str:
    if not isinstance(value, str) or not S3_URI.match(value):
        raise InvalidField("model_uri", "must look like s3://bucket/prefix/")
    return value if value.endswith("/") else value + "/"


def parse_resources(value: Any, base: Resources) -> Resources:
    value = _object("resources", value, {"gpu_memory_gb", "gpu_count"})
    memory = _number("resources.gpu_memory_gb", value.get("gpu_memory_gb", base.gpu_memory_gb),
                     minimum=0.0, exclusive=True)
    count = _integer("resources.gpu_count", value.get("gpu_count", base.gpu_count), minimum=1)
    return Resources(gpu_memory_gb=memory, gpu_count=count)


def parse_scaling(value: Any, base: Scaling) -> Scaling:
    value = _object("scaling", value, set(Scaling.__dataclass_fields__))
    scaling = Scaling(
        min_replicas=_integer("scaling.min_replicas",
                              value.get("min_replicas", base.min_replicas), minimum=0),
        max_replicas=_integer("scaling.max_replicas",
                              value.get("max_replicas", base.max_replicas), minimum=1),
        target_concurrency=_integer("scaling.target_concurrency",
                                    value.get("target_concurrency", base.target_concurrency),
                                    minimum=1),
        idle_timeout_s=_number("scaling.idle_timeout_s",
                               value.get("idle_timeout_s", base.idle_timeout_s), minimum=0.0))
    if scaling.min_replicas > scaling.max_replicas:
        raise InvalidField("scaling.min_replicas", "must not exceed scaling.max_replicas")
    return scaling


def parse_pricing(value: Any, base: Pricing) -> Pricing:
    value = _object("pricing", value, set(Pricing.__dataclass_fields__))
    prices = {}
    for name in Pricing.__dataclass_fields__:
        if name in value:
            try:
                prices[name] = parse_price(f"pricing.{name}", value[name])
            except ValueError as exc:
                field_name, _, message = str(exc).partition(": ")
                raise InvalidField(field_name, message) from None
    if "input_per_mtok" in prices and "cached_input_per_mtok" not in prices \
            and base == Pricing():
        prices["cached_input_per_mtok"] = prices["input_per_mtok"]
    return replace(base, **prices)


def parse_engine(value: Any) -> dict[str, Any]:
    value = _object("engine", value, ENGINE_FIELDS)
    if "dtype" in value and value["dtype"] not in ("float32", "float16", "bfloat16"):
        raise InvalidField("engine.dtype", "one of float32, float16, bfloat16")
    if value.get("quantization") not in (None, "int8"):
        raise InvalidField("engine.quantization", "null or 'int8'")
    if "enable_prefix_caching" in value and not isinstance(value["enable_prefix_caching"], bool):
        raise InvalidField("engine.enable_prefix_caching", "must be true or false")
    spec = value.get("speculative")
    if spec is not None and (not isinstance(spec, dict)
                             or spec.get("method") not in ("ngram", "draft")):
        raise InvalidField("engine.speculative", "null or {\"method\": \"ngram\"|\"draft\", ...}")
    for name in ("kv_cache_tokens", "tensor_parallel_size", "max_num_seqs",
                 "max_num_batched_tokens", "max_model_len", "block_size"):
        if value.get(name) is not None:
            _integer(f"engine.{name}", value[name], minimum=1)
    return dict(value)


def patched_config(base: RevisionConfig, patch: DeploymentPatch) -> RevisionConfig:
    """The revision config a PATCH asks for (validated against the current one)."""
    return check_parallelism(RevisionConfig(
        model_uri=parse_model_uri(patch.model_uri) if patch.model_uri else base.model_uri,
        resources=(parse_resources(patch.resources, base.resources)
                   if patch.resources is not None else base.resources),
        engine=(parse_engine(_merge(base.engine, patch.engine))
                if patch.engine is not None else base.engine),
        pricing=(parse_pricing(patch.pricing, base.pricing)
                 if patch.pricing is not None else base.pricing)))


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


def check_model(info: ModelInfo, resources: Resources) -> None:
    """The model in S3 is one thawpool's engine runs, and a replica on `gpu_count` GPUs
    can split its attention heads (what `pool.inspect_model` read from config.json)."""
    if info.architecture not in SUPPORTED_ARCHITECTURES:
        raise InvalidField("model_uri",
                           f"unsupported architecture {info.architecture!r} in config.json; "
                           f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    _check_heads(info, resources.gpu_count)


def _check_heads(info: ModelInfo, gpu_count: int) -> None:
    """Tensor parallelism splits attention heads whole, gpu_count ways (0: config.json
    does not say, which cannot be split either)."""
    if gpu_count == 1:
        return
    counts = {"num_attention_heads": info.num_attention_heads,
              "num_key_value_heads": info.num_key_value_heads}
    for name, value in counts.items():
        if value <= 0 or value % gpu_count:
            raise InvalidField("resources.gpu_count",
                               f"{gpu_count} does not divide the model's {name} ({value}); "
                               "a replica on several GPUs splits the heads between them")


def _object(name: str, value: Any, allowed: Optional[AbstractSet[str]]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidField(name, "must be a JSON object")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            prefix = "" if name == "body" else f"{name}."
            raise InvalidField(f"{prefix}{unknown[0]}", "unknown field")
    return value


def _integer(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(name, "must be an integer")
    if value < minimum:
        raise InvalidField(name, f"must be >= {minimum}")
    return value


def _number(name: str, value: Any, minimum: float, exclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidField(name, "must be a number")
    if value < minimum or (exclusive and value == minimum):
        raise InvalidField(name, f"must be {'>' if exclusive else '>='} {minimum}")
    return float(value)
