"""Memory-aware best-fit placement: a pure decision over a snapshot of slots.

A replica needs `slot_count` slots on one node with `bytes_per_slot` free on
each. Best fit: among the nodes that can take it, the choice that leaves the
least memory free, so large holes stay open for large models. Packing by
predicted load comes first: a replica expected to keep `load` of each GPU's
compute busy goes where that does not take a GPU past MAX_LOAD with what its
replicas are expected to use already, when such slots exist (many rarely
called models share a GPU; two busy ones do not, since they would run their
steps in turn). With no loads given (all 0) this is plain best fit. Nodes named in
`prefer_nodes` (on a cluster: those whose cache already holds the revision's
weights, so the cold start skips the download) go before all others; best
fit decides among the preferred, and among the rest. A sleeping replica that wakes
asks for the very slots it gave back (`on_slots`): its process is bound to them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Optional, Sequence, Union

from pool.api import ModelInfo
from spec.engine_options import EngineOptions

GB = 1024 ** 3
MAX_LOAD = 1.0                       # a GPU's compute, busy all the time
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2,
               "bfloat16": 2, "bf16": 2, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class SlotState:
    slot_id: str
    node: str
    memory_bytes: int
    reserved_bytes: int = 0
    exclusive: bool = False          # one replica at a time (a whole Ray GPU)
    load: float = 0.0                # the compute its replicas are expected to keep busy (1: all)

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.reserved_bytes


@dataclass(frozen=True)
class PlacementRequest:
    bytes_per_slot: int
    slot_count: int = 1
    on_slots: tuple[str, ...] = ()   # these slots and no others (a waking sleeper's own)
    load: float = 0.0                # the share of each GPU's compute it is expected to use


@dataclass(frozen=True)
class Placed:
    node: str
    slot_ids: tuple[str, ...]
    bytes_per_slot: int


@dataclass(frozen=True)
class NoCapacity:
    """Fits an empty node but not now: the replica waits in pending."""
    reason: str


Decision = Union[Placed, NoCapacity]


def place(request: PlacementRequest, slots: Sequence[SlotState],
          prefer_nodes: Collection[str] = ()) -> Decision:
    best: Optional[tuple[tuple[int, bool, int, str], tuple[SlotState, ...]]] = None
    if request.on_slots:
        slots = [s for s in slots if s.slot_id in request.on_slots]
    for node, node_slots in _by_node(slots).items():
        chosen = _best_slots(request, node_slots)
        if chosen is None:
            continue
        leftover = sum(s.free_bytes - request.bytes_per_slot for s in chosen)
        overloaded = sum(1 for s in chosen if _overloads(request, s))
        rank = (overloaded, node not in prefer_nodes, leftover, node)      # False sorts first: preferred
        if best is None or rank < best[0]:
            best = (rank, chosen)
    if best is None:
        return NoCapacity(f"waiting for capacity: no node has {request.slot_count} slot(s) "
                          f"with {_gb(request.bytes_per_slot)} free")
    rank, chosen = best
    return Placed(rank[3], tuple(s.slot_id for s in chosen), request.bytes_per_slot)


def never_fits(request: PlacementRequest, slots: Sequence[SlotState]) -> Optional[str]:
    """Why this request could not be placed even on an empty pool, or None."""
    empty = [SlotState(s.slot_id, s.node, s.memory_bytes) for s in slots]
    if isinstance(place(request, empty), Placed):
        return None
    largest = max((s.memory_bytes for s in slots), default=0)
    most = max((len(v) for v in _by_node(slots).values()), default=0)
    return (f"needs {request.slot_count} slot(s) with {_gb(request.bytes_per_slot)} each on one "
            f"node; the largest slot has {_gb(largest)} and the largest node {most} slot(s)")


def _best_slots(request: PlacementRequest, slots: Sequence[SlotState]) -> Optional[tuple[SlotState, ...]]:
    fitting = sorted((s for s in slots if s.free_bytes >= request.bytes_per_slot),
                     key=lambda s: (_overloads(request, s), s.free_bytes, s.slot_id))
    if len(fitting) < request.slot_count:
        return None
    return tuple(fitting[:request.slot_count])


def _overloads(request: PlacementRequest, slot: SlotState) -> bool:
    return request.load > 0 and slot.load + request.load > MAX_LOAD


def _by_node(slots: Sequence[SlotState]) -> dict[str, list[SlotState]]:
    nodes: dict[str, list[SlotState]] = {}
    for slot in slots:
        nodes.setdefault(slot.node, []).append(slot)
    return nodes


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GiB"


# -- how much memory a revision needs -------------------------------------

RUNTIME_DEFAULT_DTYPE = EngineOptions().dtype

def weight_bytes(info: ModelInfo, dtype: Optional[str], quantization: Optional[str]) -> int:
    """Weights at the runtime dtype; int8 stores linear weights in one byte (+ scales); a
    quantized checkpoint's quantized weights take their own bytes whatever the dtype."""
    width = DTYPE_BYTES.get(dtype or "", 0)
    if info.quantized_parameters:
        rest = info.num_parameters - info.quantized_parameters
        return info.quantized_bytes + rest * (width or _checkpoint_width(info))
    total = info.num_parameters * width if width else info.weight_bytes
    if quantization == "int8" and info.linear_parameters:
        per = width or _checkpoint_width(info)
        total -= info.linear_parameters * (per - 1)
    return total


def weights_of(info: ModelInfo, engine: Mapping[str, Any]) -> int:
    """The weights of a replica of this engine config (what a sleeper keeps in host memory)."""
    return weight_bytes(info, engine.get("dtype") or RUNTIME_DEFAULT_DTYPE, engine.get("quantization"))


def kv_bytes(info: ModelInfo, dtype: Optional[str], tokens: int, gpu_count: int = 1) -> int:
    """The KV cache of the whole replica: with more ranks than KV heads each rank caches
    its own copy of one (runtime/tensor_parallel/shards.py), so there are gpu_count of them."""
    width = DTYPE_BYTES.get(dtype or "", 0) or _checkpoint_width(info)
    heads = max(info.num_key_value_heads, gpu_count)
    return 2 * info.num_hidden_layers * heads * info.head_dim * width * tokens


def request_for(info: ModelInfo, gpu_memory_gb: float, gpu_count: int,
                engine: Mapping[str, Any], kv_tokens_default: int, overhead_fraction: float,
                draft: Optional[ModelInfo] = None) -> PlacementRequest:
    """Per-slot need: max(declared gpu_memory_gb, (weights + KV) * (1 + overhead) / slots).

    A speculative draft model adds its own weights and KV cache: the runtime runs it at
    the target's dtype, unquantized, with as many KV tokens as the target."""
    # The runtime computes in float32 unless told otherwise (spec.engine_options.EngineOptions),
    # whatever width the checkpoint was saved in.
    dtype = engine.get("dtype") or RUNTIME_DEFAULT_DTYPE
    tokens = engine.get("kv_cache_tokens") or kv_tokens_default
    need = weight_bytes(info, dtype, engine.get("quantization")) + kv_bytes(info, dtype, tokens, gpu_count)
    if draft is not None:
        need += weight_bytes(draft, dtype, None) + kv_bytes(draft, dtype, tokens)
    count = max(1, int(gpu_count))
    per_slot = math.ceil(need * (1.0 + overhead_fraction) / count)
    return PlacementRequest(max(per_slot, int(gpu_memory_gb * GB)), count)


def _checkpoint_width(info: ModelInfo) -> int:
    return DTYPE_BYTES.get(info.dtype, 4)
