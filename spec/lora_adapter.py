"""What a PEFT LoRA adapter must be for the engine to apply it: the one home of the rules
the control plane checks when an adapter is attached (from adapter_config.json and the
safetensors header, read from S3) and the runtime checks again when a replica loads it.
No torch: the control plane imports this.

Each targeted projection p of layer i adds scaling * B @ A @ x to p's output (PEFT's
LoRA, dropout off at inference), with A [r, in], B [out, r] and scaling lora_alpha / r
(lora_alpha / sqrt(r) with use_rslora). Refused with a ValueError naming the field:
another PEFT method, DoRA, trained biases, saved modules, a rank above the base's
max_lora_rank, per-module rank or alpha patterns, a target other than the attention and
MLP projections (lm_head and embeddings included), or tensors whose shapes are not the
base's (an adapter trained on another model).
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024 * 1024     # a safetensors header; ours are a few KB
MAX_WEIGHTS_BYTES = 2 * 1024 ** 3       # far above a rank-64 adapter of a 70B model's projections

# PEFT's module names, and where each sits in the engine's fused projections
ATTENTION = ("q_proj", "k_proj", "v_proj")
MLP = ("gate_proj", "up_proj")
MODULES = (*ATTENTION, "o_proj", *MLP, "down_proj")
DTYPES = frozenset({"F32", "F16", "BF16"})
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_REFUSED = {"use_dora": "DoRA is not supported",
            "fan_in_fan_out": "Conv1D-style weights are not supported",
            "modules_to_save": "saved (fully trained) modules are not supported",
            "rank_pattern": "per-module ranks are not supported",
            "alpha_pattern": "per-module alphas are not supported",
            "layers_to_transform": "a subset of layers is given by the weights, not this setting"}


@dataclass(frozen=True)
class AdapterSettings:
    """adapter_config.json, as far as the engine reads it."""
    rank: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


@dataclass(frozen=True)
class BaseDims:
    """The base model's sizes an adapter's tensors must match (one rank, no TP)."""
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(out, in) of each projection an adapter may target."""
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
                "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def parse_settings(raw: Any, max_rank: int) -> AdapterSettings:
    """adapter_config.json (bytes, text or the parsed object), refused with a ValueError
    naming the field for anything the engine cannot apply."""
    settings = _object(raw)
    if settings.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"peft_type: {str(settings.get('peft_type'))[:40]!r} is not LORA")
    rank = settings.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError("r: must be a positive integer")
    if rank > max_rank:
        raise ValueError(f"r: rank {rank} is above this base's max_lora_rank ({max_rank})")
    for field, why in _REFUSED.items():
        if settings.get(field):
            raise ValueError(f"{field}: {why}")
    if settings.get("bias", "none") != "none":
        raise ValueError("bias: trained biases are not supported (bias must be 'none')")
    alpha = settings.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError("lora_alpha: must be a number")
    targets = settings.get("target_modules")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise ValueError("target_modules: must be a list of module names (q_proj, ..., down_proj)")
    unknown = sorted(set(targets) - set(MODULES))
    if unknown:
        raise ValueError(f"target_modules: {', '.join(u[:40] for u in unknown[:4])} cannot be applied "
                         f"(the engine applies {', '.join(MODULES)})")
    return AdapterSettings(rank, float(alpha), bool(settings.get("use_rslora")),
                           tuple(m for m in MODULES if m in targets))


def _object(raw: Any) -> Mapping[str, Any]:
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"{CONFIG_FILE}: larger than {MAX_CONFIG_BYTES} bytes")
        raw = bytes(raw).decode("utf-8", errors="replace")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{CONFIG_FILE}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{CONFIG_FILE}: must be a JSON object")
    return raw


def header_length(prefix: bytes) -> int:
    """The safetensors header's length, from the file's first 8 bytes."""
    if len(prefix) < 8:
        raise ValueError(f"{WEIGHTS_FILE}: too short to be safetensors")
    (length,) = struct.unpack("<Q", prefix[:8])
    if not 2 <= length <= MAX_HEADER_BYTES:
        raise ValueError(f"{WEIGHTS_FILE}: a header of {length} bytes is not safetensors")
    return int(length)


def tensor_shapes(header: bytes) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from a safetensors header (the JSON after the length),
    refusing dtypes other than floats."""
    try:
        entries = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{WEIGHTS_FILE}: its header is not JSON") from None
    if not isinstance(entries, dict):
        raise ValueError(f"{WEIGHTS_FILE}: its header is not a JSON object")
    shapes = {}
    for key, entry in entries.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES or \
                not isinstance(entry.get("shape"), list) or \
                not all(isinstance(d, int) and not isinstance(d, bool) for d in entry["shape"]):
            raise ValueError(f"{WEIGHTS_FILE}: {key[:120]} is not a float tensor (F32, F16 or BF16)")
        shapes[key] = tuple(entry["shape"])
    return shapes


def check_tensors(shapes: Mapping[str, Sequence[int]], settings: AdapterSettings,
                  dims: BaseDims) -> list[tuple[int, str]]:
    """The (layer, module) pairs the adapter changes, once each tensor is a LoRA A or B of
    a targeted projection with the base's shapes at the adapter's rank."""
    halves: dict[tuple[int, str], set[str]] = {}
    module_shapes = dims.module_shapes()
    for key, shape in shapes.items():
        layer, module, half = key_parts(key, dims)
        out_features, in_features = module_shapes[module]
        want = (settings.rank, in_features) if half == "A" else (out_features, settings.rank)
        if tuple(shape) != want:
            raise ValueError(f"{WEIGHTS_FILE}: layer {layer} {module} lora_{half} is {tuple(shape)}, where "
                             f"this base needs {want}: an adapter of another base model?")
        halves.setdefault((layer, module), set()).add(half)
    missing = [f"layer {i} {m}" for (i, m), h in sorted(halves.items()) if h != {"A", "B"}]
    if missing:
        raise ValueError(f"{WEIGHTS_FILE}: {', '.join(missing[:4])} lacks its A or B")
    if not halves:
        raise ValueError(f"{WEIGHTS_FILE}: holds no LoRA weights")
    return sorted(halves)


def key_parts(key: str, dims: BaseDims) -> tuple[int, str, str]:
    """(layer, module, "A" or "B") of a tensor's name, for a layer the base has."""
    found = _KEY.match(key)
    if found is None or found.group(3) not in MODULES:
        raise ValueError(f"{WEIGHTS_FILE}: {key[:120]} is not a LoRA A or B of a layer's "
                         f"{', '.join(MODULES)} (lm_head and embedding deltas are not supported)")
    layer = int(found.group(1))
    if layer >= dims.num_hidden_layers:
        raise ValueError(f"{WEIGHTS_FILE}: {key[:120]} names layer {layer}; the base has "
                         f"{dims.num_hidden_layers}")
    return layer, found.group(3), found.group(4)


def check_header(data: bytes, settings: AdapterSettings, dims: BaseDims) -> list[tuple[int, str]]:
    """check_tensors over a safetensors file's first bytes (its length and whole header)."""
    length = header_length(data)
    if len(data) < 8 + length:
        raise ValueError(f"{WEIGHTS_FILE}: cut off inside its header")
    return check_tensors(tensor_shapes(data[8:8 + length]), settings, dims)
