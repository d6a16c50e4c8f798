"""GGUF's quantized blocks repacked into the engine's group-wise layout (kernels/group_quant.py).

`repack(raw, type_name)` turns one tensor's bytes, as rows of ggml blocks, into the
layout's arrays without widening a value: the codes each block stores, its float16 scales
and mins moved into per-group arrays, the K-quants' integer sub-scales under their float16
super-block scale. What the layout then computes is bit for bit what gguf's own
`dequantize` gives (tests/runtime/test_gguf_repack.py checks every type):

| type  | codes          | group | scale               | offset               |
|-------|----------------|-------|---------------------|----------------------|
| Q4_0  | 4-bit, 0..15   | 32    | d                   | -8 d                 |
| Q4_1  | 4-bit, 0..15   | 32    | d                   | m                    |
| Q4_K  | 4-bit, 0..15   | 32    | sc x d (per 256)    | m x -dmin (per 256)  |
| Q5_0  | 8-bit, -16..15 | 32    | d                   | -                    |
| Q5_1  | 8-bit, 0..31   | 32    | d                   | m                    |
| Q5_K  | 8-bit, 0..31   | 32    | sc x d (per 256)    | m x -dmin (per 256)  |
| Q6_K  | 8-bit, -32..31 | 16    | sc x d (per 256)    | -                    |
| Q8_0  | 8-bit          | 32    | d                   | -                    |

Pure numpy over whole tensors at once (no loop over blocks).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

# kernels/group_quant.py's PARTS, written out: the importer stays free of torch
PARTS = ("codes", "scales", "offsets", "scale_super", "offset_super")


QK_K = 256


@dataclass(frozen=True)
class Repacked:
    """The arrays of one kernels.group_quant.GroupQuantized, in numpy."""
    codes: np.ndarray
    scales: np.ndarray
    bits: int
    group: int
    offsets: Optional[np.ndarray] = None
    scale_super: Optional[np.ndarray] = None
    offset_super: Optional[np.ndarray] = None
    super_every: int = 1

    def arrays(self) -> dict[str, np.ndarray]:
        """The tensors by field name (the ones present)."""
        return {name: value for name in PARTS if (value := getattr(self, name)) is not None}

    def rows(self, order: np.ndarray) -> "Repacked":
        """The same weight with its rows (output channels) in `order`."""
        return Repacked(**{**self.__dict__, **{k: v[order] for k, v in self.arrays().items()}})


def q4_0_offsets_fit(raw: np.ndarray) -> bool:
    """Whether every -8 d of these Q4_0 rows is a float16 (else the offsets are float32)."""
    return _eight_fits(_f16(_blocks(raw, 18)[..., 0:2]))


def _eight_fits(d: np.ndarray) -> bool:
    return bool((np.abs(d.astype(np.float32)) * 8 <= np.finfo(np.float16).max).all())


def repack(raw: np.ndarray, type_name: str) -> Repacked:
    """raw: uint8 [rows, bytes per row] of `type_name` blocks -> its Repacked arrays."""
    return REPACKERS[type_name](raw)


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    rows = raw.shape[0]
    return np.ascontiguousarray(raw).reshape(rows, -1, block_bytes)


def _f16(b: np.ndarray) -> np.ndarray:
    """[rows, blocks, 2] bytes -> [rows, blocks] float16."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.reshape(a.shape[0], -1))


def _nibbles_in_order(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of ggml's Q4 block (value j low, j + 16 high) -> [..., 32] codes."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _pack(codes: np.ndarray) -> np.ndarray:
    """[rows, K] codes 0..15 -> [rows, K/2] in the layout's 32-value blocks."""
    rows = codes.shape[0]
    blocks = codes.astype(np.uint8).reshape(rows, -1, 2, 16)
    return _flat(blocks[:, :, 0] | (blocks[:, :, 1] << 4))


def _minus_eight(d: np.ndarray) -> np.ndarray:
    """-8 d in float16 (exact: a power of two), or in float32 past float16's range."""
    return d * np.float16(-8) if _eight_fits(d) else d.astype(np.float32) * np.float32(-8)


def _q4_0(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 18)
    d = _f16(b[..., 0:2])
    # ggml's Q4 block is already the layout's 4-bit block: its 16 bytes are copied as they are
    return Repacked(codes=_flat(b[..., 2:]), scales=d, offsets=_minus_eight(d), bits=4, group=32)


def _q4_1(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 20)
    return Repacked(codes=_flat(b[..., 4:]), scales=_f16(b[..., 0:2]), offsets=_f16(b[..., 2:4]),
                    bits=4, group=32)


def _q8_0(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 34)
    return Repacked(codes=_flat(b[..., 2:]).view(np.int8), scales=_f16(b[..., 0:2]), bits=8, group=32)


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: [.., 4] high bits (a little-endian u32) and [.., 16] low nibbles -> [.., 32]."""
    high = np.unpackbits(qh, axis=-1, bitorder="little")          # bit j of the u32 -> value j
    out: np.ndarray = _nibbles_in_order(qs) | (high << 4)
    return out


def _q5_0(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 22)
    q = _five_bit(b[..., 2:6], b[..., 6:]).astype(np.int8) - np.int8(16)
    return Repacked(codes=_flat(q), scales=_f16(b[..., 0:2]), bits=8, group=32)


def _q5_1(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 24)
    q = _five_bit(b[..., 4:8], b[..., 8:]).astype(np.int8)
    return Repacked(codes=_flat(q), scales=_f16(b[..., 0:2]), offsets=_f16(b[..., 2:4]), bits=8, group=32)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins -> ([.., 8], [.., 8]) uint8."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_levels(b: np.ndarray) -> dict[str, Any]:
    """Q4_K/Q5_K's scale fields: integer sub-scales and mins under d and -dmin."""
    sc, mn = _k_scale_min(b[..., 4:16])
    return dict(scales=_flat(sc).astype(np.float16), scale_super=_f16(b[..., 0:2]),
                offsets=_flat(mn).astype(np.float16), offset_super=-_f16(b[..., 2:4]), super_every=8)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """[.., 128] bytes: 4 chunks of 32, each low nibbles then high nibbles -> [.., 256] in order."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=-1).reshape(*qs.shape[:-1], QK_K)


def _q4_k(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 144)
    return Repacked(codes=_pack(_flat(_k_low_nibbles(b[..., 16:]))), bits=4, group=32, **_k_levels(b))


def _q5_k(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 176)
    qh = b[..., 16:48]                                              # bit i of byte j: value 32 i + j
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    codes = _k_low_nibbles(b[..., 48:]) | (high.reshape(*qh.shape[:-1], QK_K) << 4)
    return Repacked(codes=_flat(codes.astype(np.int8)), bits=8, group=32, **_k_levels(b))


def _q6_k(raw: np.ndarray) -> Repacked:
    b = _blocks(raw, 210)
    lead = b.shape[:-1]
    low = b[..., 0:128].reshape(*lead, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    high = b[..., 128:192].reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    q = (low & 0x0F).reshape(*lead, 8, 32) | ((high & 0x03).reshape(*lead, 8, 32) << 4)
    codes = q.astype(np.int8) - np.int8(32)
    sc = b[..., 192:208].view(np.int8)
    return Repacked(codes=_flat(codes.reshape(*lead, QK_K)), scales=_flat(sc).astype(np.float16),
                    scale_super=_f16(b[..., 208:210]), bits=8, group=16, super_every=16)


REPACKERS: dict[str, Callable[[np.ndarray], Repacked]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q5_K": _q5_k,
    "Q6_K": _q6_k, "Q8_0": _q8_0,
}
