"""Model and engine configuration: what config.json says, and how the engine runs it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from spec.architectures import SUPPORTED_ARCHITECTURES

QUANTIZATION_METHODS = (None, "int8")           # int8: weight-only, see runtime/load/quantization.py


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


@dataclass
class EngineConfig:
    """How one replica runs a model; built from the LLM / LLMEngine keyword arguments."""
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    kv_cache_tokens: Optional[int] = None        # None: sized from a memory budget
    kv_cache_memory_fraction: float = 0.5        # of free device memory (CPU: of available RAM)
    kv_cache_max_bytes_cpu: int = 4 << 30        # sane cap on the CPU
    enable_prefix_caching: bool = True
    cache_salt: Optional[str] = None             # e.g. a revision id; changes every block hash
    speculative: Optional[dict[str, Any]] = None
    quantization: Optional[str] = None
    tensor_parallel_size: int = 1
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: Optional[int] = None          # None: the model's max_position_embeddings
    seed: int = 0
    task: str = "generate"                       # or "embed": pooled hidden states (runtime/engine/pooling.py)
    pooling: str = "last"                        # embed: "last" token or "mean" over the prompt
    kv_cache_dtype: str = "auto"                 # "auto": the model's dtype; "bfloat16": half the bytes
    batch_invariant: bool = False                # a request's logprobs the same bits in any batch (CPU)
    packed_cache_dir: Optional[str] = None       # CPU: the node's packed layers (runtime/load/packed_weights.py)
    packed_cache_gb: float = 16.0                # ... and its size, least recently used evicted
    cuda_graphs: bool = False                    # decode steps replayed as CUDA graphs (runtime/engine/cuda_graphs.py)
    cpu_low_precision: bool = False              # bf16 / W8A8 GEMMs where the CPU has them (kernels/cpu/features.py)

    def validate(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: {self.dtype!r} is not one of float32, bfloat16, float16")
        if self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization: {self.quantization!r} is not supported "
                             f"(use None or {', '.join(repr(m) for m in QUANTIZATION_METHODS[1:])})")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer")
        check_task(self.task, self.pooling, self.speculative)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: {self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        if self.cuda_graphs and not (self.device.startswith("cuda") and self.tensor_parallel_size == 1):
            raise ValueError("cuda_graphs: decode graphs need a CUDA device and one rank "
                             f"(device {self.device!r}, tensor_parallel_size {self.tensor_parallel_size})")
        if self.batch_invariant and not self.device.startswith("cpu"):
            raise ValueError("batch_invariant: the batch-invariant kernels are the CPU's; "
                             f"device {self.device!r} has none yet")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise ValueError(f"kv_cache_tokens: must be at least block_size ({self.block_size})")


KV_CACHE_DTYPES = ("auto", "bfloat16")
TASKS = ("generate", "embed")
POOLINGS = ("last", "mean")


def check_task(task: str, pooling: str, speculative: Optional[dict[str, Any]]) -> None:
    if task not in TASKS:
        raise ValueError(f"task: {task!r} is not one of {', '.join(TASKS)}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling: {pooling!r} is not one of {', '.join(POOLINGS)}")
    if task == "embed" and speculative is not None:
        raise ValueError("speculative: an embedding model generates nothing to speculate on")
