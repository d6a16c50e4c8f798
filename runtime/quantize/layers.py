"""A float model folder's decoder layers run one at a time over calibration sequences,
with the inputs of each linear recorded: what GPTQ's Hessians and AWQ's searches read.

The layers run on the engine's own blocks (runtime/models/attention.py's Attention and
mlp.py's GatedMLP over the torch reference kernels), so the quantizers calibrate on the
computation the engine serves. Served here: the checkpoints LlamaModel reads (Llama,
Mistral, Qwen2, Qwen3), whose layers hold separate q/k/v/o and gate/up/down projections.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from kernels.dispatch import reference_kernels
from runtime.core.config import ModelConfig
from runtime.models.attention import Attention
from runtime.models.batch import ForwardBatch, PrefillMeta
from runtime.models.decoder import LayerWeights
from runtime.models.mlp import GatedMLP
from runtime.models.rope import make_rotary
from runtime.tensor_parallel.shards import TensorParallel
from spec.architectures import ARCHITECTURES

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LINEARS = ATTENTION + MLP
# the linears that read one input: q/k/v, o, gate/up, down (one recorded input each)
SITES = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}
SERVED = "llama:LlamaModel"
BLOCK = 16                     # KV cache block size of the calibration forward

Layer = dict[str, torch.Tensor]            # a layer's tensors by name under model.layers.<i>.


def weight_name(linear: str) -> str:
    """The name of a linear's weight under its layer's prefix: q_proj -> self_attn.q_proj.weight."""
    return f"{'self_attn' if linear in ATTENTION else 'mlp'}.{linear}.weight"


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


@dataclass
class FloatModel:
    folder: Path
    config: ModelConfig
    tensors: dict[str, torch.Tensor]           # every tensor of the checkpoint, float32

    def layer(self, i: int) -> Layer:
        """Layer i's tensors (the same tensor objects: an edit of the dict's values is the model's)."""
        p = layer_prefix(i)
        return {name[len(p):]: t for name, t in self.tensors.items() if name.startswith(p)}

    def set_layer(self, i: int, layer: Layer) -> None:
        p = layer_prefix(i)
        self.tensors.update({p + name: t for name, t in layer.items()})


def read_model(folder: Path) -> FloatModel:
    """ValueError where the folder is not a float checkpoint of an architecture served here."""
    config = ModelConfig.from_dir(folder)
    if config.quantization_config is not None:
        raise ValueError(f"{folder}: quantized already (config.json has a quantization_config)")
    served = ARCHITECTURES.get(config.architecture)
    if served is None or served.model != SERVED:
        raise ValueError(f"{folder}: architecture {config.architecture} is not one the quantizers run "
                         "(Llama, Mistral, Qwen2, Qwen3)")
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update({k: v.float() for k, v in load_file(str(folder / name)).items()})
    return FloatModel(folder, config, tensors)


@dataclass
class Recorder:
    """A linear kernel that keeps the input of the weights it is told to watch."""
    sites: dict[int, str] = field(default_factory=dict)        # id(weight) -> site
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        site = self.sites.get(id(weight))
        if site is not None:
            self.inputs[site] = x.detach()
        return F.linear(x, weight, bias)


class LayerRunner:
    """The decoder layers of `config` over calibration sequences ids [S, L], every one a
    fresh prefill. Hidden states are [S * L, H] float32."""

    def __init__(self, config: ModelConfig, ids: torch.Tensor) -> None:
        self.config, self.ids = config, ids
        s, length = ids.shape
        tp = TensorParallel()
        self.recorder = Recorder()
        ops = dataclasses.replace(reference_kernels(), linear=self.recorder.linear)
        scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.attention_block = Attention(config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                                         scale, config.attn_logit_softcap, config.rms_norm_eps, ops, tp)
        self.mlp_block = GatedMLP(ops.silu_and_mul, ops, tp)
        self.ops = ops
        positions = torch.arange(length).repeat(s)
        self.rotary = make_rotary(config, "cpu")
        self.cos_sin = self.rotary.cos_sin(positions)
        slots = torch.arange(s * length)
        self.batch = ForwardBatch(positions=positions, slot_mapping=slots, logits_indices=slots[-1:],
                                  prefill=PrefillMeta(num_tokens=s * length, query_lens=[length] * s,
                                                      context_lens=[length] * s, block_tables=None))
        blocks = -(-s * length // BLOCK)
        shape = (blocks, BLOCK, config.num_key_value_heads, config.head_dim)
        self.kv_cache = (torch.zeros(shape), torch.zeros(shape))

    def embed(self, model: FloatModel) -> torch.Tensor:
        return F.embedding(self.ids.reshape(-1), model.tensors["model.embed_tokens.weight"])

    def norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.ops.rms_norm(h, weight, self.config.rms_norm_eps)
        return out

    def attention(self, x: torch.Tensor, layer: Layer, i: int) -> torch.Tensor:
        """The attention block's output (o_proj's) for its normed input x."""
        window = self.config.layer_windows[i] if self.config.layer_windows else None
        out: torch.Tensor = self.attention_block(x, self._weights(layer), self.rotary, self.cos_sin, window,
                                                 self.batch, self.kv_cache)
        return out

    def mlp(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        out: torch.Tensor = self.mlp_block(x, self._weights(layer))
        return out

    def forward(self, h: torch.Tensor, layer: Layer, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Layer i on the residual stream h: the next h, and the input of each SITE."""
        self.recorder.inputs = {}
        x = self.norm(h, layer["input_layernorm.weight"])
        h = h + self.attention(x, layer, i)
        x = self.norm(h, layer["post_attention_layernorm.weight"])
        h = h + self.mlp(x, layer)
        inputs, self.recorder.inputs = self.recorder.inputs, {}
        return h, inputs

    def _weights(self, layer: Layer) -> LayerWeights:
        """The engine's LayerWeights of a layer (q/k/v and gate/up stacked), its matmuls watched."""
        def stacked(names: tuple[str, ...]) -> torch.Tensor:
            parts = [layer[weight_name(n)] for n in names]
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        weights = {site: stacked(names) for site, names in SITES.items()}
        self.recorder.sites = {id(w): site for site, w in weights.items()}
        bias = None
        if "self_attn.q_proj.bias" in layer:
            bias = torch.cat([layer[f"self_attn.{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")])
        return LayerWeights(attn_norm=layer["input_layernorm.weight"], qkv=weights["qkv"], o=weights["o"],
                            mlp_norm=layer["post_attention_layernorm.weight"], gate_up=weights["gate_up"],
                            down=weights["down"], qkv_bias=bias, q_norm=layer.get("self_attn.q_norm.weight"),
                            k_norm=layer.get("self_attn.k_norm.weight"))
