"""The models a simulated deployment may serve, how often each is picked, and its tensor parallelism.

The catalogue spans 0.5B to 70B parameters (the sizes of the Qwen2.5, Llama
2/3 and Code Llama families). Weights are bf16: 2 bytes a parameter.

Mix: a deployment picks entry i with probability proportional to
parameters_b ** -size_skew. No public trace gives the mix of model sizes a
serverless pool serves; the rule only encodes "bigger models are rarer" with
one knob. At the default skew 0.5 the mix is 0.5B 34%, 1.5B 20%, 3B 14%,
7B 9%, 8B 9%, 13B 7%, 34B 4%, 70B 3%.

Tensor parallelism: a replica gets the smallest power of two of GPUs whose
memory holds the weights plus `headroom` of them again (KV cache,
activations, the CUDA context). On 80 GiB GPUs with 30% headroom: 70B
(140 GB -> 182 GB) takes 4 GPUs, 34B (68 GB -> 88 GB) takes 2, 13B and
smaller take 1; on 141 GB GPUs 70B takes 2.
"""
from __future__ import annotations

from dataclasses import dataclass

from poolsim.workload import ModelShape

BYTES_PER_PARAMETER = 2          # bf16


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    name: str
    parameters_b: float


CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry("qwen2.5-0.5b", 0.5),
    CatalogueEntry("qwen2.5-1.5b", 1.5),
    CatalogueEntry("qwen2.5-3b", 3.0),
    CatalogueEntry("llama-2-7b", 7.0),
    CatalogueEntry("llama-3-8b", 8.0),
    CatalogueEntry("llama-2-13b", 13.0),
    CatalogueEntry("codellama-34b", 34.0),
    CatalogueEntry("llama-3-70b", 70.0),
)


def weight_bytes(parameters_b: float) -> int:
    return round(parameters_b * 1e9 * BYTES_PER_PARAMETER)


def gpu_count(weights: int, gpu_memory_bytes: int, headroom: float, max_gpus: int) -> int:
    """Smallest power of two of GPUs holding weights * (1 + headroom); ValueError past max_gpus."""
    needed = weights * (1.0 + headroom)
    count = 1
    while count * gpu_memory_bytes < needed:
        count *= 2
        if count > max_gpus:
            raise ValueError(f"{weights} bytes of weights need more than {max_gpus} GPUs "
                             f"of {gpu_memory_bytes} bytes")
    return count


def model_shape(entry: CatalogueEntry, gpu_memory_bytes: int, headroom: float, max_gpus: int) -> ModelShape:
    weights = weight_bytes(entry.parameters_b)
    return ModelShape(name=entry.name, parameters_b=entry.parameters_b, weight_bytes=weights,
                      gpu_count=gpu_count(weights, gpu_memory_bytes, headroom, max_gpus))


def size_mix(catalogue: tuple[CatalogueEntry, ...], skew: float) -> tuple[float, ...]:
    """The probability of each entry: proportional to parameters_b ** -skew."""
    weights = [entry.parameters_b ** -skew for entry in catalogue]
    total = sum(weights)
    return tuple(w / total for w in weights)
