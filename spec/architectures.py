"""The architectures the runtime serves, by the name config.json gives them (no torch: the
control plane imports SUPPORTED_ARCHITECTURES to refuse any other at deploy time).

Each names the model class that runs it (runtime/models/, imported only when a model
is loaded) and what the engine options can do with it. A model class serves several
architectures when they differ only in config.json (e.g. Llama, Mistral, Qwen2, Qwen3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ServedArchitecture:
    model: str                       # "module:Class" under runtime.models
    tensor_parallel: bool = True     # runtime/tensor_parallel/shards.py knows how to split its weights
    int8: bool = True                # runtime/load/quantization.py covers all of its matmuls
    lora: bool = True                # runtime/lora/ applies adapters to its projections


ARCHITECTURES: dict[str, ServedArchitecture] = {
    "LlamaForCausalLM": ServedArchitecture("llama:LlamaModel"),
    "MistralForCausalLM": ServedArchitecture("llama:LlamaModel"),
    "Qwen2ForCausalLM": ServedArchitecture("llama:LlamaModel"),
    "Qwen3ForCausalLM": ServedArchitecture("llama:LlamaModel"),
    "Gemma2ForCausalLM": ServedArchitecture("gemma:GemmaModel"),
    "Gemma3ForCausalLM": ServedArchitecture("gemma:GemmaModel"),
    # fused qkv_proj / gate_up_proj: a rank's slice is not one range of rows
    # (and PEFT names them so: an adapter's targets are not the engine's q/k/v and gate/up)
    "Phi3ForCausalLM": ServedArchitecture("phi3:Phi3Model", tensor_parallel=False, lora=False),
    # experts: neither split across ranks nor quantized yet
    "MixtralForCausalLM": ServedArchitecture("mixtral:MixtralModel", tensor_parallel=False, int8=False,
                                             lora=False),
    "Qwen3MoeForCausalLM": ServedArchitecture("mixtral:Qwen3MoeModel", tensor_parallel=False, int8=False,
                                              lora=False),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def engine_option_refusal(architecture: str, tensor_parallel_size: int,
                          quantization: Optional[str], max_loras: int = 0) -> Optional[tuple[str, str]]:
    """(option, why) for an engine option the architecture's model class cannot honour;
    None when it can. The control plane refuses such a deploy (422 naming the option)
    before a replica is ever started; the engine refuses it too."""
    arch = ARCHITECTURES[architecture]
    if tensor_parallel_size > 1 and not arch.tensor_parallel:
        able = ", ".join(name for name, a in ARCHITECTURES.items() if a.tensor_parallel)
        return ("tensor_parallel_size", f"{architecture} runs on one rank only "
                                        f"(tensor parallelism serves {able})")
    if quantization is not None and not arch.int8:
        return ("quantization", f"{quantization} does not cover {architecture}'s experts "
                                "yet; serve it unquantized")
    if max_loras and (why := lora_refusal(architecture)) is not None:
        return ("max_loras", why)
    if max_loras and tensor_parallel_size > 1:
        return ("max_loras", "adapters run on one rank for now (tensor_parallel_size 1)")
    return None


def check_engine_options(architecture: str, tensor_parallel_size: int,
                         quantization: Optional[str], max_loras: int = 0) -> None:
    """ValueError naming the option and the architecture (engine_option_refusal)."""
    refusal = engine_option_refusal(architecture, tensor_parallel_size, quantization, max_loras)
    if refusal is not None:
        raise ValueError(f"{refusal[0]}: {refusal[1]}")



def lora_refusal(architecture: str) -> Optional[str]:
    """Why adapters (engine option max_loras) cannot run on this architecture; None when
    they can."""
    if ARCHITECTURES[architecture].lora:
        return None
    able = ", ".join(name for name, a in ARCHITECTURES.items() if a.lora)
    return f"adapters do not run on {architecture} (they run on {able})"
