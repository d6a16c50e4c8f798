"""Strict validation of deployment bodies; every refusal is a 422 naming the field."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from controlplane.errors import invalid
from controlplane.pricing import Pricing, parse_price

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
    resources: Optional[dict] = None
    scaling: Optional[dict] = None
    engine: Optional[dict] = None
    pricing: Optional[dict] = None
    promote: bool = True


def parse_create(body: Any) -> DeploymentSpec:
    body = _object("body", body, CREATE_FIELDS)
    for required in ("name", "model_uri"):
        if required not in body:
            raise invalid(required, "is required")
    name = body["name"]
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid("name", "lowercase letters, digits and '-', 1-63 characters")
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
        raise invalid("body", "nothing to change")
    promote = body.get("promote", True)
    if not isinstance(promote, bool):
        raise invalid("promote", "must be true or false")
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
        raise invalid("model_uri", "must look like s3://bucket/prefix/")
    return value if value.endswith("/") else value + "/"


def split_s3_uri(uri: str) -> tuple[str, str]:
    match = S3_URI.match(uri)
    return match["bucket"], match["prefix"].strip("/") + "/"


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
        raise invalid("scaling.min_replicas", "must not exceed scaling.max_replicas")
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
                raise invalid(field_name, message) from None
    if "input_per_mtok" in prices and "cached_input_per_mtok" not in prices \
            and base == Pricing():
        prices["cached_input_per_mtok"] = prices["input_per_mtok"]
    return replace(base, **prices)


def parse_engine(value: Any) -> dict[str, Any]:
    value = _object("engine", value, ENGINE_FIELDS)
    if "dtype" in value and value["dtype"] not in ("float32", "float16", "bfloat16"):
        raise invalid("engine.dtype", "one of float32, float16, bfloat16")
    if value.get("quantization") not in (None, "int8"):
        raise invalid("engine.quantization", "null or 'int8'")
    if "enable_prefix_caching" in value and not isinstance(value["enable_prefix_caching"], bool):
        raise invalid("engine.enable_prefix_caching", "must be true or false")
    spec = value.get("speculative")
    if spec is not None and (not isinstance(spec, dict)
                             or spec.get("method") not in ("ngram", "draft")):
        raise invalid("engine.speculative", "null or {\"method\": \"ngram\"|\"draft\", ...}")
    for name in ("kv_cache_tokens", "tensor_parallel_size", "max_num_seqs",
                 "max_num_batched_tokens", "max_model_len", "block_size"):
        if value.get(name) is not None:
            _integer(f"engine.{name}", value[name], minimum=1)
    return dict(value)


def check_parallelism(revision: RevisionConfig) -> RevisionConfig:
    """A replica on N GPUs runs one tensor-parallel rank per GPU: the two must agree."""
    size = revision.engine.get("tensor_parallel_size")
    if size is not None and size != revision.resources.gpu_count:
        raise invalid("engine.tensor_parallel_size",
                      f"must equal resources.gpu_count ({revision.resources.gpu_count}): "
                      "a replica runs one rank per GPU")
    return revision


def check_heads(config: dict, gpu_count: int) -> None:
    """Tensor parallelism splits attention heads whole, gpu_count ways."""
    if gpu_count == 1:
        return
    heads = config.get("num_attention_heads")
    counts = {"num_attention_heads": heads, "num_key_value_heads": config.get("num_key_value_heads") or heads}
    for name, value in counts.items():
        if not isinstance(value, int) or value % gpu_count:
            raise invalid("resources.gpu_count",
                          f"{gpu_count} does not divide the model's {name} ({value}); "
                          "a replica on several GPUs splits the heads between them")


def check_architecture(config: Any) -> str:
    """The architecture named by a config.json, if thawpool's engine runs it."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise invalid("model_uri", f"unsupported architecture {arch!r} in config.json; "
                                   f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    return arch


def _object(name: str, value: Any, allowed: Optional[set]) -> dict:
    if not isinstance(value, dict):
        raise invalid(name, "must be a JSON object")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            prefix = "" if name == "body" else f"{name}."
            raise invalid(f"{prefix}{unknown[0]}", "unknown field")
    return value


def _integer(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, "must be an integer")
    if value < minimum:
        raise invalid(name, f"must be >= {minimum}")
    return value


def _number(name: str, value: Any, minimum: float, exclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(name, "must be a number")
    if value < minimum or (exclusive and value == minimum):
        raise invalid(name, f"must be {'>' if exclusive else '>='} {minimum}")
    return float(value)
