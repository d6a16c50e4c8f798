"""Group-wise quantized weights (4- and 8-bit codes, a scale per group), pure torch.

The one layout every quantized checkpoint is repacked into (GGUF's Q4/Q5/Q6/Q8 types at
import, runtime/gguf/repack.py; AWQ, GPTQ and compressed-tensors at load), and what the
CPU, Triton and torch kernels read. A weight `w: [N, K]` (N output channels) is cut along
K into groups of `group` values; value k of row n is

    w[n, k] = scale[n, g] * code[n, k] + offset[n, g]        g = k // group

computed in float32, where

    scale[n, g]  = scales[n, g]  * scale_super[n, g // super_every]    (scale_super: or 1)
    offset[n, g] = offsets[n, g] * offset_super[n, g // super_every]   (offsets: or 0)

Two levels, because llama.cpp's K-quants store small integer scales per 16 or 32 values
under one float16 per 256: kept as they are (float16 holds those integers exactly), every
product above is exact in float32 and the result is bit for bit what gguf's own
dequantization gives, at close to the file's size (a float32 scale per group instead would
grow a Q4_K tensor by a third).

codes, chosen for the kernels:
- bits 4: uint8 [N, K // 2], unsigned codes 0..15, in blocks of 32 values per 16 bytes:
  byte j of a block holds value j in its low nibble and value j + 16 in its high nibble, so
  one 16-byte load, a mask and a shift give 32 values in order (GGUF's Q4_0 and Q4_1
  blocks are already this). group is a multiple of 32.
- bits 8: int8 [N, K], one signed code per value (5- and 6-bit types fit), any group.

input_order (GPTQ with act_order): x's columns are taken in this order first, the weight's
K having been reordered so that its groups are contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

BLOCK = 32                     # values per 16-byte block of 4-bit codes
# a weight's per-row tensors: what a file stores of it, what stacks along N
PARTS = ("codes", "scales", "offsets", "scale_super", "offset_super")
FLOAT_DTYPES = (torch.float16, torch.float32)
DEQUANTIZE_ROWS = 1024         # rows widened at a time by the chunked torch linear


@dataclass(frozen=True)
class GroupQuantized:
    codes: torch.Tensor                         # uint8 [N, K/2] (bits 4) or int8 [N, K] (bits 8)
    scales: torch.Tensor                        # float16/float32 [N, K/group]
    bits: int
    group: int
    offsets: Optional[torch.Tensor] = None      # float16/float32 [N, K/group]
    scale_super: Optional[torch.Tensor] = None  # float16 [N, K/group/super_every]
    offset_super: Optional[torch.Tensor] = None  # float16 [N, K/group/super_every]
    super_every: int = 1
    input_order: Optional[torch.Tensor] = None  # int64 [K]
    # What a kernel derives from the weight once and keeps beside it (the C kernel's view
    # of its tensors), by kernel: never part of its value, and a copy (map, rows,
    # replace) starts without it.
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int]:
        n, width = self.codes.shape
        return n, width * 8 // self.bits

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in (getattr(self, f.name) for f in fields(self)) if isinstance(v, torch.Tensor)]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "GroupQuantized":
        """The same weight with fn applied to each of its tensors (a move, a row slice)."""
        return replace(self, **{f.name: fn(getattr(self, f.name)) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    def rows(self, start: int, stop: int) -> "GroupQuantized":
        """Output channels start..stop (every tensor but input_order is per row)."""
        order = self.input_order
        part = replace(self, input_order=None).map(lambda t: t[start:stop])
        return replace(part, input_order=order)


def check(w: GroupQuantized) -> None:
    """Raises ValueError naming what does not fit the layout."""
    n, k = w.shape
    if w.bits not in (4, 8):
        raise ValueError(f"bits: {w.bits} (4 or 8)")
    want = torch.uint8 if w.bits == 4 else torch.int8
    if w.codes.dtype != want or w.codes.dim() != 2:
        raise ValueError(f"codes: {w.codes.dtype} {tuple(w.codes.shape)}, expected a 2-d {want}")
    if w.group <= 0 or k % w.group or (w.bits == 4 and w.group % BLOCK):
        raise ValueError(f"group: {w.group} does not divide K={k}" +
                         (f" in multiples of {BLOCK}" if w.bits == 4 else ""))
    groups = k // w.group
    _check_per_group("scales", w.scales, (n, groups))
    if w.offsets is not None:
        _check_per_group("offsets", w.offsets, (n, groups))
    if groups % w.super_every:
        raise ValueError(f"super_every: {w.super_every} does not divide the {groups} groups")
    for name in ("scale_super", "offset_super"):
        t = getattr(w, name)
        if t is not None:
            _check_per_group(name, t, (n, groups // w.super_every))
    if w.offset_super is not None and w.offsets is None:
        raise ValueError("offset_super: given without offsets")
    if w.input_order is not None and tuple(w.input_order.shape) != (k,):
        raise ValueError(f"input_order: shape {tuple(w.input_order.shape)}, expected ({k},)")


def _check_per_group(name: str, t: torch.Tensor, shape: tuple[int, int]) -> None:
    if t.dtype not in FLOAT_DTYPES or tuple(t.shape) != shape:
        raise ValueError(f"{name}: {t.dtype} {tuple(t.shape)}, expected float16 or float32 {shape}")


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] integer codes 0..15 (K a multiple of 32) -> uint8 [N, K/2] in the 4-bit layout."""
    n, k = codes.shape
    blocks = codes.to(torch.uint8).reshape(n, k // BLOCK, 2, BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_codes(w: GroupQuantized) -> torch.Tensor:
    """[N, K] codes as float32."""
    if w.bits == 8:
        return w.codes.float()
    n, half = w.codes.shape
    blocks = w.codes.reshape(n, half // (BLOCK // 2), 1, BLOCK // 2)
    both = torch.cat([blocks & 0x0F, blocks >> 4], dim=2)        # [N, blocks, 2, 16]
    return both.reshape(n, half * 2).float()


def group_scales(w: GroupQuantized) -> torch.Tensor:
    """[N, K/group] float32: the scale of each group, both levels multiplied."""
    return _levels(w.scales, w.scale_super, w.super_every)


def group_offsets(w: GroupQuantized) -> Optional[torch.Tensor]:
    return None if w.offsets is None else _levels(w.offsets, w.offset_super, w.super_every)


def _levels(lower: torch.Tensor, upper: Optional[torch.Tensor], every: int) -> torch.Tensor:
    if upper is None:
        return lower.float()
    return lower.float() * upper.float().repeat_interleave(every, dim=1)


def dequantize(w: GroupQuantized) -> torch.Tensor:
    """[N, K] float32, the definition above (in the weight's own K order)."""
    n, k = w.shape
    q = unpack_codes(w).reshape(n, k // w.group, w.group)
    out = q * group_scales(w)[..., None]
    offsets = group_offsets(w)
    if offsets is not None:
        out = out + offsets[..., None]
    return out.reshape(n, k)


def dequantize_rows(w: GroupQuantized, index: torch.Tensor) -> torch.Tensor:
    """[len(index), K] float32: rows `index` of the weight (an embedding lookup), in x's
    column order (input_order undone)."""
    rows = dequantize(replace(w, input_order=None).map(lambda t: t.index_select(0, index)))
    if w.input_order is None:
        return rows
    return torch.empty_like(rows).index_copy_(1, w.input_order, rows)


def order_input(x: torch.Tensor, w: GroupQuantized) -> torch.Tensor:
    return x if w.input_order is None else x.index_select(-1, w.input_order)


def linear_ref(x: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The definition: x @ dequantize(w).T in float32 (+ bias), cast to x's dtype.
    x: [..., K] -> [..., N]."""
    out = order_input(x.float(), w) @ dequantize(w).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def linear(x: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """linear_ref computed DEQUANTIZE_ROWS output channels at a time (the widened copy of
    a large matrix, an lm head, never exists whole): where no kernel of its own runs."""
    n, k = w.shape
    x2 = order_input(x.reshape(-1, k).float(), w)
    out = torch.empty(x2.shape[0], n, dtype=torch.float32, device=x.device)
    for start in range(0, n, DEQUANTIZE_ROWS):
        stop = min(n, start + DEQUANTIZE_ROWS)
        out[:, start:stop] = F.linear(x2, dequantize(w.rows(start, stop)))
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def stack_rows(parts: list[GroupQuantized]) -> Optional[GroupQuantized]:
    """The parts stacked along N as one weight (fused q/k/v, gate/up), or None when their
    formats differ (a GGUF file may store v in another type than q and k). Parts of one
    input share a GPTQ act-order: stacked only when it is the same."""
    first = parts[0]
    same = all(p.bits == first.bits and p.group == first.group and p.super_every == first.super_every
               and p.shape[1] == first.shape[1] and _same_order(p.input_order, first.input_order)
               and all((getattr(p, f) is None) == (getattr(first, f) is None)
                       and (getattr(p, f) is None or getattr(p, f).dtype == getattr(first, f).dtype)
                       for f in PARTS)
               for p in parts)
    if not same:
        return None
    return replace(first, **{f: torch.cat([getattr(p, f) for p in parts]) for f in PARTS
                             if getattr(first, f) is not None})


def _same_order(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
