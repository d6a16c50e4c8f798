"""Model and engine configuration: what config.json says, and how the engine runs it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
QUANTIZATION_METHODS = (None, "int8")           # int8: weight-only, see runtime/quantization.py


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
    """transformers 5 writes rope_parameters; older folders use rope_theta + rope_scaling."""
    params = dict(data.get("rope_parameters") or {})
    scaling = dict(data.get("rope_scaling") or {}) or params
    theta = float(params.get("rope_theta", data.get("rope_theta", 10000.0)))
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type not in ("llama3", "linear"):
        raise ValueError(f"rope_scaling: rope_type {rope_type!r} is not supported")
    return theta, {**scaling, "rope_type": rope_type}


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
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise ValueError(f"kv_cache_tokens: must be at least block_size ({self.block_size})")
