"""GGUF's quantized types repacked into the engine's layout: bit for bit gguf's own values."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gguf
import gguf.quants

from kernels import group_quant
from runtime.gguf.repack import REPACKERS, repack
from spec.gguf import GGML_TYPES

TYPE_IDS = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}
# byte offsets of each type's float16 fields within its block (kept finite below)
HALF_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
               "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Any bytes are a valid block but for its float16 fields: random bits there, made finite."""
    _, per_block, block_bytes = GGML_TYPES[TYPE_IDS[type_name]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // per_block, block_bytes), dtype=np.uint8)
    for at in HALF_FIELDS[type_name]:
        halves = rng.standard_normal((rows, cols // per_block)).astype(np.float16) * np.float16(0.01)
        raw[..., at:at + 2] = halves.view(np.uint8).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


def as_weight(raw: np.ndarray, type_name: str) -> group_quant.GroupQuantized:
    r = repack(raw, type_name)
    w = group_quant.GroupQuantized(bits=r.bits, group=r.group, super_every=r.super_every,
                                   **{k: torch.from_numpy(v.copy()) for k, v in r.arrays().items()})
    group_quant.check(w)
    return w


@pytest.mark.parametrize("type_name", sorted(REPACKERS))
def test_repacked_values_are_ggufs_bit_for_bit(type_name):
    raw = random_blocks(type_name, rows=6, cols=512)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(TYPE_IDS[type_name]))
    got = group_quant.dequantize(as_weight(raw, type_name)).numpy()
    assert got.shape == expected.shape
    assert np.array_equal(bits(got), bits(expected))


def bits(a: np.ndarray) -> np.ndarray:
    """The float32 bit patterns, but for the sign of zero: Q4_0's d (q - 8) is -0 at q = 8
    and d < 0, where the layout's d q + (-8 d) is +0 (equal numbers, in any product or sum)."""
    return (a.astype(np.float32) + np.float32(0)).view(np.uint32)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantized_by_gguf_itself(type_name):
    """Blocks gguf's own quantizer wrote from real-looking weights, not only random bytes."""
    w = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(TYPE_IDS[type_name]))
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(TYPE_IDS[type_name]))
    assert np.array_equal(group_quant.dequantize(as_weight(raw, type_name)).numpy(), expected)
    assert np.abs(expected - w).max() < 0.35                  # the quantizer kept the weights


def test_q4_0_past_float16s_range_keeps_exact_offsets():
    raw = random_blocks("Q4_0", rows=2, cols=64)
    raw.reshape(2, 2, 18)[0, 0, 0:2] = np.array([60000.0], dtype=np.float16).view(np.uint8)
    w = as_weight(raw, "Q4_0")
    assert w.offsets.dtype == torch.float32
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(bits(group_quant.dequantize(w).numpy()), bits(expected))


def test_rows_reorder_every_array():
    raw = random_blocks("Q4_K", rows=4, cols=256)
    r = repack(raw, "Q4_K")
    order = np.array([2, 0, 3, 1])
    moved = r.rows(order)
    for name, array in moved.arrays().items():
        assert np.array_equal(array, r.arrays()[name][order]), name


@pytest.mark.parametrize("type_name", sorted(REPACKERS))
def test_the_spec_layout_says_what_repack_makes_and_its_bytes(type_name):
    """spec/gguf_layouts.py sizes replicas before any byte is read: it must match."""
    from spec.gguf import TensorInfo
    from spec.gguf_layouts import LAYOUTS, kept_bytes

    raw = random_blocks(type_name, rows=6, cols=512)
    r = repack(raw, type_name)
    layout = LAYOUTS[type_name]
    assert (r.bits, r.group, r.super_every, r.offsets is not None) == \
        (layout.bits, layout.group, layout.super_every, layout.offsets)
    info = TensorInfo("w", (6, 512), TYPE_IDS[type_name], 0)
    assert kept_bytes(info) == sum(a.nbytes for a in r.arrays().values())
    assert set(LAYOUTS) == set(REPACKERS)


def test_the_importers_part_names_are_the_layouts():
    """repack.py writes the layout's part names out (it stays free of torch): the same."""
    from runtime.gguf import repack as module

    assert module.PARTS == group_quant.PARTS
