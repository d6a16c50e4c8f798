"""Model and engine configuration: what config.json says, and how the engine runs it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from spec.architectures import SUPPORTED_ARCHITECTURES
from spec.engine_options import EngineOptions, option_values

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}   # config.json's -> ours
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen3MoeForCausalLM")
# whose config.json `layer_types` say which layers slide; the others slide everywhere when
# `sliding_window` is set (as their transformers classes do)
LAYER_TYPED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")


@dataclass(frozen=True)
class MoEConfig:
    """A sparse mixture of experts in place of the MLP (Mixtral, Qwen3-MoE)."""
    num_experts: int
    top_k: int                               # experts per token
    intermediate_size: int                   # of each expert
    normalize_top_k: bool                    # the top_k weights are rescaled to sum to 1
    dense_layers: tuple[int, ...] = ()       # layers that keep a dense MLP (Qwen3-MoE)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict[str, Any]] = None      # None or {"rope_type": "llama3"|"linear", ...}
    attention_bias: bool = False             # Qwen2: bias on q/k/v
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"                   # what the checkpoint says
    hidden_act: str = "silu"                 # "silu" (SwiGLU) or "gelu_tanh" (GeGLU: Gemma)
    # per layer: the sliding window it attends within, None for full attention; () all full
    layer_windows: tuple[Optional[int], ...] = ()
    attn_logit_softcap: Optional[float] = None     # Gemma 2: scores capped by c * tanh(s / c)
    final_logit_softcap: Optional[float] = None    # Gemma 2 and 3: logits capped the same way
    query_pre_attn_scalar: Optional[float] = None  # Gemma: scores scaled by its -1/2 power
    local_rope_theta: Optional[float] = None       # Gemma 3: rope base of the sliding layers
    partial_rotary_factor: float = 1.0       # Phi-4-mini: rotary on this fraction of each head
    moe: Optional[MoEConfig] = None
    # a quantized checkpoint's config.json quantization_config (runtime/load/checkpoint_formats.py)
    quantization_config: Optional[dict[str, Any]] = None

    @property
    def kv_window(self) -> Optional[int]:
        """When every layer slides: the widest window, beyond which no layer reads k/v again."""
        windows = [w for w in self.layer_windows if w is not None]
        if not windows or len(windows) < self.num_hidden_layers:
            return None
        return max(windows)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"model: no config.json in {model_dir}")
        data = json.loads(path.read_text())
        extra_eos = _generation_eos(model_dir)
        return cls.from_dict(data, extra_eos)

    @classmethod
    def from_dict(cls, data: dict[str, Any], extra_eos: tuple[int, ...] = ()) -> "ModelConfig":
        arch = _architecture(data)
        heads = data["num_attention_heads"]
        hidden = data["hidden_size"]
        theta, scaling = _rope(data)
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=data["intermediate_size"],
            num_hidden_layers=data["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or hidden // heads,
            vocab_size=data["vocab_size"],
            max_position_embeddings=data.get("max_position_embeddings", 2048),
            rms_norm_eps=data.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=arch == "Qwen2ForCausalLM" or bool(data.get("attention_bias", False)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", arch == "Qwen2ForCausalLM")),
            bos_token_id=data.get("bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(_as_ids(data.get("eos_token_id")) + extra_eos)),
            dtype=str(data.get("torch_dtype") or data.get("dtype") or "float32"),
            quantization_config=data.get("quantization_config"),
            **_architecture_fields(data, arch),
        )


def _architecture(data: dict[str, Any]) -> str:
    archs = data.get("architectures") or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return str(arch)
    named = ", ".join(archs) if archs else "none given"
    raise ValueError(
        f"architecture: {named} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")


def _rope(data: dict[str, Any]) -> tuple[float, Optional[dict[str, Any]]]:
    """transformers 5 writes rope_parameters (Gemma 3: one set per layer type, the global
    layers' here); older folders use rope_theta + rope_scaling."""
    params = dict(data.get("rope_parameters") or {})
    params = dict(params.get("full_attention") or params)
    scaling = dict(data.get("rope_scaling") or {}) or params
    theta = float(params.get("rope_theta", data.get("rope_theta", 10000.0)))
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type       # Phi-3's first name for it
    if rope_type == "default":
        return theta, None
    if rope_type not in ("llama3", "linear", "longrope"):
        raise ValueError(f"rope_scaling: rope_type {rope_type!r} is not supported")
    if rope_type == "longrope":
        scaling.setdefault("original_max_position_embeddings", data.get("original_max_position_embeddings"))
    return theta, {**scaling, "rope_type": rope_type}


def _architecture_fields(data: dict[str, Any], arch: str) -> dict[str, Any]:
    """What only some families' config.json say: activation, sliding windows, soft caps,
    Gemma's attention scale and local rope, partial rotary, experts."""
    act = data.get("hidden_activation") or data.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise ValueError(f"hidden_act: {act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    if data.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention: only causal language models are served")
    params = data.get("rope_parameters") or {}
    gemma3 = arch == "Gemma3ForCausalLM"
    local = (params.get("sliding_attention") or {}).get("rope_theta", data.get("rope_local_base_freq", 10000.0))
    return dict(
        hidden_act=ACTIVATIONS[act],
        layer_windows=_layer_windows(data, arch),
        attn_logit_softcap=data.get("attn_logit_softcapping") if arch == "Gemma2ForCausalLM" else None,
        final_logit_softcap=data.get("final_logit_softcapping") if arch.startswith("Gemma") else None,
        query_pre_attn_scalar=data.get("query_pre_attn_scalar") if arch.startswith("Gemma") else None,
        local_rope_theta=float(local) if gemma3 else None,
        partial_rotary_factor=float(params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))),
        moe=_moe(data, arch),
    )


def _layer_windows(data: dict[str, Any], arch: str) -> tuple[Optional[int], ...]:
    window, layers = data.get("sliding_window"), int(data["num_hidden_layers"])
    # Qwen's configs carry a window that applies only with use_sliding_window (default off)
    if not window or not data.get("use_sliding_window", not arch.startswith("Qwen")):
        return ()
    if arch not in LAYER_TYPED:
        return (int(window),) * layers
    types = data.get("layer_types") or _default_layer_types(data, arch, layers)
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


def _default_layer_types(data: dict[str, Any], arch: str, layers: int) -> list[str]:
    """transformers' defaults for a config.json without layer_types."""
    if arch.startswith("Qwen"):
        slides = [i >= data.get("max_window_layers", 28) for i in range(layers)]
    else:
        pattern = 2 if arch == "Gemma2ForCausalLM" else int(data.get("sliding_window_pattern", 6))
        slides = [bool((i + 1) % pattern) for i in range(layers)]
    return ["sliding_attention" if s else "full_attention" for s in slides]


def _moe(data: dict[str, Any], arch: str) -> Optional[MoEConfig]:
    experts = data.get("num_local_experts") or data.get("num_experts")
    if arch not in MOE_ARCHITECTURES or not experts:
        return None
    step, only = data.get("decoder_sparse_step") or 1, set(data.get("mlp_only_layers") or ())
    return MoEConfig(
        num_experts=int(experts),
        top_k=int(data["num_experts_per_tok"]),
        intermediate_size=int(data.get("moe_intermediate_size") or data["intermediate_size"]),
        normalize_top_k=arch == "MixtralForCausalLM" or bool(data.get("norm_topk_prob", False)),
        dense_layers=tuple(i for i in range(data["num_hidden_layers"]) if i in only or (i + 1) % step),
    )


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _generation_eos(model_dir: Path) -> tuple[int, ...]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    return _as_ids(json.loads(path.read_text()).get("eos_token_id"))


@dataclass(frozen=True, kw_only=True)
class EngineConfig(EngineOptions):
    """How one replica runs a model: the engine's options (spec/engine_options.py: their
    fields, defaults and one `validate`) and the model folder they run. It extends the
    options rather than holding them so that the runtime reads `config.block_size`, not
    `config.options.block_size`, at each of its many call sites."""
    model: str

    @classmethod
    def of(cls, model: str, options: EngineOptions) -> "EngineConfig":
        return cls(model=model, **option_values(options))
