"""Which GGUF tensors the engine keeps quantized, in what layout, and the bytes they take.

The runtime's importer repacks these types into kernels/group_quant.py's layout
(runtime/gguf/repack.py); the pool sizes a replica by the same table before any byte is
downloaded (pool/weights/gguf.py). Pure Python, like the rest of spec/.
"""
from __future__ import annotations

from dataclasses import dataclass

from spec.gguf import TensorInfo


@dataclass(frozen=True)
class Layout:
    """What a type repacks into, known without its data."""
    bits: int                 # 4: two codes a byte; 8: a signed byte each
    group: int                # values per scale
    offsets: bool             # a float16 offset per group (a min), besides the scale
    super_every: int = 1      # > 1: scales (and offsets) are integers under a float16 per this many groups


LAYOUTS = {"Q4_0": Layout(4, 32, True), "Q4_1": Layout(4, 32, True), "Q4_K": Layout(4, 32, True, 8),
           "Q5_0": Layout(8, 32, False), "Q5_1": Layout(8, 32, True), "Q5_K": Layout(8, 32, True, 8),
           "Q6_K": Layout(8, 16, False, 16), "Q8_0": Layout(8, 32, False)}


def kept_quantized(info: TensorInfo) -> bool:
    """A matrix of a type the engine has kernels for (the rest are dequantized at import)."""
    return len(info.shape) == 2 and info.type_name in LAYOUTS


FLOAT_TYPES = ("F32", "F16", "BF16")


def widened(info: TensorInfo) -> bool:
    """A quantized tensor of a type without kernels: dequantized to floats at import."""
    return not kept_quantized(info) and info.type_name not in FLOAT_TYPES


def kept_bytes(info: TensorInfo) -> int:
    """Its bytes in the layout (float16 scales and offsets; Q4_0's offsets past float16's
    range, which no trained model has, would take two bytes more per group)."""
    layout = LAYOUTS[info.type_name]
    rows, cols = info.shape
    groups = rows * cols // layout.group
    per_group = 2 + (2 if layout.offsets else 0)
    supers = groups // layout.super_every if layout.super_every > 1 else 0
    per_super = 2 + (2 if layout.offsets else 0)
    return rows * cols * layout.bits // 8 + groups * per_group + supers * per_super
