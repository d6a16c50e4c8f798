"""Hugging Face quantized checkpoints (AWQ, GPTQ, compressed-tensors, FP8) repacked into
the engine's layouts as they load.

`gather` replaces the checkpoint tensors of each quantized linear `P` by one entry
`P.weight`:
- 4-bit formats (AWQ, GPTQ, compressed-tensors pack-quantized) store w = s * (q - z) per
  group; that is a `GroupQuantized` (kernels/group_quant.py) of codes q, scale s and offset
  -s * z: every product is exact in float32 (s has at most 11 significant bits, q and z
  4), so its values are bit for bit the format's own dequantization computed in float32.
  The offset is float16 where that holds it exactly, float32 otherwise.
- compressed-tensors int-quantized (W8A8): an `Int8Weight`, what the engine's int8 path runs.
- FP8 (quant_method "fp8", compressed-tensors float-quantized): an `Fp8Weight`.

`keep_dtype(scheme)` is the `keep` of read_weights: the scales stay as stored, so the
engine's dtype never rounds them. What each format's tensors mean (each checked against
its reference implementation: AutoAWQ's dequantize_gemm, AutoGPTQ/GPTQModel's
dequantize_weight, compressed-tensors' unpack_from_int32 and dequantize):
- AWQ: qweight [K, N/8] int32, nibble i of column c holding output channel
  8c + AWQ_ORDER[i]; qzeros [K/g, N/8] the same; scales [K/g, N].
- GPTQ (v1): qweight [K/8, N] int32, nibble i of row r holding input k = 8r + i; qzeros
  [K/g, N/8] int32 holding zero - 1 (nibble i of column c: channel 8c + i), read as
  nibble + 1 like vLLM's and exllama's kernels; scales [K/g, N]; g_idx [K] the group of
  each input column (desc_act: not k // g).
- compressed-tensors pack-quantized: weight_packed [N, K/8] int32, nibble i of column c
  holding k = 8c + i as q + 8 (q signed); weight_zero_point (asymmetric) packed the same
  way along N, [N/8, G], or unpacked int8 [N, G]; weight_scale [N, G]; weight_g_idx [K].
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import torch

from kernels.fp8 import E4M3, Fp8Weight
from kernels.group_quant import BLOCK, GroupQuantized, check, pack_nibbles
from runtime.load.quantization import Int8Weight
from runtime.load.stored_dtype import KeepDtype
from spec.quantization_config import PARTS, QuantizationScheme, keeps_dtype

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)             # nibble i of an AWQ int32 holds column AWQ_ORDER[i]
NIBBLES = 8                                      # 4-bit values per int32
Parts = dict[str, torch.Tensor]


def keep_dtype(scheme: QuantizationScheme) -> KeepDtype:
    """read_weights' `keep`: the scales (and float zero points) of quantized weights."""
    return lambda name: keeps_dtype(scheme, name)


def gather(raw: dict[str, torch.Tensor], scheme: QuantizationScheme, dtype: torch.dtype) -> dict[str, object]:
    """The checkpoint's tensors with each quantized linear's parts replaced by `P.weight`
    (GroupQuantized, Int8Weight or Fp8Weight); every other tensor as it was but a kept
    float left over, which takes `dtype`. ValueError naming the tensor that does not fit."""
    out: dict[str, object] = dict(raw)
    for prefix in _quantized_linears(raw, scheme):
        parts = {p: raw[f"{prefix}.{p}"] for p in PARTS[scheme.layout] if f"{prefix}.{p}" in raw}
        for p in parts:
            del out[f"{prefix}.{p}"]
        try:
            out[f"{prefix}.weight"] = REPACK[scheme.layout](parts, scheme)
        except KeyError as exc:
            raise ValueError(f"{prefix}: no {prefix}.{exc.args[0]} in the checkpoint") from exc
        except (ValueError, RuntimeError) as exc:
            raise ValueError(f"{prefix}: {exc}") from exc
    for name, value in out.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and keeps_dtype(scheme, name):
            out[name] = value.to(dtype)
    return _one_dtype_each(out)


def _one_dtype_each(weights: dict[str, object]) -> dict[str, object]:
    """Every GroupQuantized's scales in one dtype, and its offsets in one: float16 where it
    is exact for all of them, else float32 (exact too), so that q, k and v, or gate and
    up, stack into one weight (group_quant.stack_rows) whatever their values were."""
    grouped = {n: w for n, w in weights.items() if isinstance(w, GroupQuantized)}
    for field in ("scales", "offsets"):
        dtypes = {getattr(w, field).dtype for w in grouped.values() if getattr(w, field) is not None}
        if len(dtypes) > 1:
            grouped = {n: _widened(w, field) for n, w in grouped.items()}
    return weights | grouped


def _widened(w: GroupQuantized, field: str) -> GroupQuantized:
    value = getattr(w, field)
    return w if value is None else replace(w, **{field: value.float()})


def _quantized_linears(raw: dict[str, torch.Tensor], scheme: QuantizationScheme) -> list[str]:
    """The prefixes P whose P.<first part> is stored quantized."""
    if scheme.layout in ("awq", "gptq"):
        marker = "qweight"
    elif scheme.layout == "pack-quantized":
        marker = "weight_packed"
    else:
        marker = "weight_scale"
    suffix = "." + marker
    return [name[:-len(suffix)] for name in raw if name.endswith(suffix)]


# -- the 4-bit formats -----------------------------------------------------------------

def _awq(parts: Parts, scheme: QuantizationScheme) -> GroupQuantized:
    q = _awq_columns(parts["qweight"]).T                     # [N, K]
    z = _awq_columns(parts["qzeros"]).T                      # [N, G]
    return _group_quantized(q, parts["scales"].T, z, None)


def _awq_columns(packed: torch.Tensor) -> torch.Tensor:
    """[R, C/8] int32 in AWQ's order -> [R, C] values 0..15 in column order."""
    nibbles = _nibbles(packed)                                   # [R, C/8, 8] in packed order
    reverse = [AWQ_ORDER.index(j) for j in range(NIBBLES)]      # column j sits at nibble reverse[j]
    return nibbles[..., reverse].reshape(packed.shape[0], -1)


def _gptq(parts: Parts, scheme: QuantizationScheme) -> GroupQuantized:
    qweight = parts["qweight"]
    q = _nibbles(qweight.T).reshape(qweight.shape[1], -1)       # [N, K]: k = 8r + i
    z = _nibbles(parts["qzeros"]).reshape(parts["qzeros"].shape[0], -1).T + 1    # [N, G], v1: stored + 1
    return _group_quantized(q, parts["scales"].T, z, parts.get("g_idx"))


def _pack_quantized(parts: Parts, scheme: QuantizationScheme) -> GroupQuantized:
    packed = parts["weight_packed"]
    scale = parts["weight_scale"]
    n = packed.shape[0]
    k = int(parts["weight_shape"][1]) if "weight_shape" in parts else packed.shape[1] * NIBBLES
    q = _nibbles(packed).reshape(n, -1)[:, :k]                   # q + 8, the stored nibble
    zero = parts.get("weight_zero_point")
    if zero is None:
        signed = torch.zeros_like(scale, dtype=torch.int32)
    elif zero.dtype == torch.int32 and zero.shape[0] == -(-n // NIBBLES) != n:
        signed = _nibbles(zero.T).reshape(zero.shape[1], -1)[:, :n].T - 8    # packed along N
    else:
        signed = zero.to(torch.int32).reshape(scale.shape)
    g_idx = parts.get("weight_g_idx")
    if g_idx is not None and bool((g_idx < 0).any()):         # unset: groups are contiguous
        g_idx = None
    return _group_quantized(q, scale, signed + 8, g_idx)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., C] -> int32 [..., C, 8]: nibble i (bits 4i..4i+3) of each, 0..15."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return (packed.to(torch.int32)[..., None] >> shifts) & 0xF


def _group_quantized(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                     g_idx: Optional[torch.Tensor]) -> GroupQuantized:
    """w[n, k] = scale[n, g] * (q[n, k] - zero[n, g]), g = k // group or g_idx[k].
    q: [N, K] 0..15; scale: float [N, G]; zero: integer [N, G]."""
    n, k = q.shape
    groups = scale.shape[1]
    if tuple(scale.shape) != (n, groups) or tuple(zero.shape) != (n, groups) or k % groups:
        raise ValueError(f"scales {tuple(scale.shape)} and zeros {tuple(zero.shape)} do not fit a "
                         f"[{n}, {k}] weight")
    group = k // groups
    q, order = _contiguous_groups(q, g_idx, group)
    stored = _exact_scales(scale)
    if stored is None:          # float32 scales with more bits than q * s keeps exact
        codes = (q - zero.repeat_interleave(group, dim=1)).to(torch.int8)
        w = GroupQuantized(codes, scale.float().contiguous(), 8, group, input_order=order)
    else:
        offsets = -(stored.float() * zero.float())
        half = offsets.half()
        if stored.dtype == torch.float16 and bool(torch.equal(half.float(), offsets)):
            offsets = half
        bits = 4 if group % BLOCK == 0 else 8
        codes = pack_nibbles(q) if bits == 4 else q.to(torch.int8)
        w = GroupQuantized(codes.contiguous(), stored.contiguous(), bits, group,
                           offsets=offsets.contiguous(), input_order=order)
    check(w)
    return w


def _contiguous_groups(q: torch.Tensor, g_idx: Optional[torch.Tensor],
                       group: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """q with its columns sorted by group (stable) and the order x's columns are then taken
    in; None when they already are (g_idx absent, or k // group)."""
    k = q.shape[1]
    contiguous = torch.arange(k, device=q.device) // group
    if g_idx is None or torch.equal(g_idx.long(), contiguous):
        return q, None
    order = torch.sort(g_idx.long(), stable=True).indices
    if not torch.equal(g_idx.long()[order], contiguous):
        raise ValueError(f"g_idx: its groups are not {k // group} groups of {group} columns")
    return q[:, order], order


def _exact_scales(scale: torch.Tensor) -> Optional[torch.Tensor]:
    """The scales in the dtype to keep (float16 as stored or where it holds them, else
    float32); None where a product with a 4-bit code would round in float32."""
    if scale.dtype == torch.float16:
        return scale
    wide = scale.float()
    if torch.equal(wide.half().float(), wide):
        return wide.half()
    if scale.dtype == torch.bfloat16 or torch.equal(wide.bfloat16().float(), wide):
        return wide
    return None


# -- int8 and FP8 ----------------------------------------------------------------------

def _int8(parts: Parts, scheme: QuantizationScheme) -> Int8Weight:
    weight = parts["weight"]
    if weight.dtype != torch.int8 or weight.dim() != 2:
        raise ValueError(f"weight: {weight.dtype} {tuple(weight.shape)}, expected a 2-d int8")
    _no_zero_point(parts)
    return Int8Weight(weight, _per_row(parts["weight_scale"], weight.shape[0], expand=True))


def _fp8(parts: Parts, scheme: QuantizationScheme) -> Fp8Weight:
    weight = parts["weight"]
    if weight.dtype != E4M3 or weight.dim() != 2:
        raise ValueError(f"weight: {weight.dtype} {tuple(weight.shape)}, expected a 2-d float8_e4m3fn")
    _no_zero_point(parts)
    return Fp8Weight(weight, _per_row(parts["weight_scale"], weight.shape[0], expand=False))


def _per_row(scale: torch.Tensor, n: int, expand: bool) -> torch.Tensor:
    """float32 [N] (per channel), or [] (per tensor) unless `expand`."""
    wide = scale.float()
    if wide.numel() == 1:
        return wide.reshape(()).expand(n).contiguous() if expand else wide.reshape(())
    if wide.numel() != n:
        raise ValueError(f"weight_scale: shape {tuple(scale.shape)}, expected one per tensor or per row ({n})")
    return wide.reshape(n).contiguous()


def _no_zero_point(parts: Parts) -> None:
    zero = parts.get("weight_zero_point")
    if zero is not None and bool(zero.any()):
        raise ValueError("weight_zero_point: not zero, but the scheme is symmetric")


REPACK: dict[str, Callable[[Parts, QuantizationScheme], object]] = {
    "awq": _awq, "gptq": _gptq, "pack-quantized": _pack_quantized,
    "int-quantized": _int8, "float-quantized": _fp8, "fp8": _fp8,
}
