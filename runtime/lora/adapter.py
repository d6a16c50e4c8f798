"""A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) read and
checked against its base model.

Each targeted projection p of layer i adds scaling * B @ A @ x to p's output (PEFT's
LoRA, dropout off at inference), with A [r, in], B [out, r] and scaling lora_alpha / r
(lora_alpha / sqrt(r) with use_rslora). What the engine cannot apply is refused with a
ValueError naming the field: another PEFT method, DoRA, trained biases, saved modules, a
rank above the engine's max_lora_rank, per-module rank or alpha patterns, a target
other than the attention and MLP projections (lm_head and embeddings included), or
tensors whose shapes are not the base's (an adapter trained on another model).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.core.config import ModelConfig

# PEFT's module names, and where each sits in the engine's fused projections
ATTENTION = ("q_proj", "k_proj", "v_proj")
MLP = ("gate_proj", "up_proj")
MODULES = (*ATTENTION, "o_proj", *MLP, "down_proj")
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass
class LoraAdapter:
    name: str
    rank: int
    scaling: float
    # (layer, module) -> (A [r, in], B [out, r] * scaling), float32 on the host
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection an adapter may target, for one rank (no TP)."""
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def read_adapter(name: str, folder: str | Path, config: ModelConfig, max_rank: int) -> LoraAdapter:
    folder = Path(folder)
    settings = _settings(folder)
    rank = _check_settings(settings, max_rank)
    alpha = settings.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError("lora_alpha: must be a number")
    scaling = alpha / (math.sqrt(rank) if settings.get("use_rslora") else rank)
    pairs = _pairs(folder, config)
    shapes = module_shapes(config)
    weights = {}
    for (layer, module), (a, b) in sorted(pairs.items()):
        out_features, in_features = shapes[module]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise ValueError(f"adapter_model.safetensors: layer {layer} {module} has A {tuple(a.shape)} and "
                             f"B {tuple(b.shape)}, where this base needs A ({rank}, {in_features}) and B "
                             f"({out_features}, {rank}): an adapter of another base model?")
        weights[(layer, module)] = (a.float().contiguous(), (b.float() * scaling).contiguous())
    return LoraAdapter(name, rank, scaling, weights)


def _settings(folder: Path) -> dict[str, Any]:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise ValueError(f"adapter: no adapter_config.json in {folder}")
    try:
        settings = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"adapter_config.json: not JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise ValueError("adapter_config.json: must be a JSON object")
    return settings


def _check_settings(settings: dict[str, Any], max_rank: int) -> int:
    """The adapter's rank, once every setting the engine cannot apply is refused."""
    if settings.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"peft_type: {settings.get('peft_type')!r} is not LORA")
    rank = settings.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError("r: must be a positive integer")
    if rank > max_rank:
        raise ValueError(f"r: rank {rank} is above this base's max_lora_rank ({max_rank})")
    refused = {"use_dora": "DoRA is not supported", "fan_in_fan_out": "Conv1D-style weights are not supported",
               "modules_to_save": "saved (fully trained) modules are not supported",
               "rank_pattern": "per-module ranks are not supported",
               "alpha_pattern": "per-module alphas are not supported",
               "layers_to_transform": "a subset of layers is given by the weights, not this setting"}
    for field, why in refused.items():
        if settings.get(field):
            raise ValueError(f"{field}: {why}")
    if settings.get("bias", "none") != "none":
        raise ValueError("bias: trained biases are not supported (bias must be 'none')")
    targets = settings.get("target_modules")
    if not isinstance(targets, list) or not targets:
        raise ValueError("target_modules: must be a list of module names (q_proj, ..., down_proj)")
    unknown = sorted(set(map(str, targets)) - set(MODULES))
    if unknown:
        raise ValueError(f"target_modules: {', '.join(unknown)} cannot be applied (the engine applies "
                         f"{', '.join(MODULES)})")
    return rank


def _pairs(folder: Path, config: ModelConfig) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    from safetensors.torch import load_file

    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise ValueError(f"adapter: no adapter_model.safetensors in {folder}")
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(path)).items():
        found = _KEY.match(key)
        if found is None or found.group(3) not in MODULES:
            raise ValueError(f"adapter_model.safetensors: {key} is not a LoRA A or B of a layer's "
                             f"{', '.join(MODULES)} (lm_head and embedding deltas are not supported)")
        layer = int(found.group(1))
        if layer >= config.num_hidden_layers:
            raise ValueError(f"adapter_model.safetensors: {key} names layer {layer}; the base has "
                             f"{config.num_hidden_layers}")
        halves.setdefault((layer, found.group(3)), {})[found.group(4)] = tensor
    missing = [f"layer {i} {m}" for (i, m), h in halves.items() if set(h) != {"A", "B"}]
    if missing:
        raise ValueError(f"adapter_model.safetensors: {', '.join(missing)} lacks its A or B")
    if not halves:
        raise ValueError("adapter_model.safetensors: holds no LoRA weights")
    return {k: (h["A"], h["B"]) for k, h in halves.items()}
