"""Group-wise quantized linear layers on the CPU (group_linear.c), signature of
kernels/group_quant.py:linear: (x [..., K], w: GroupQuantized, bias=None) -> [..., N].

- group_linear (W4A16: weight-only, x kept in fp32): up to GEMM_MIN_ROWS rows of x the C
  kernel, which decodes each group of codes in registers once per tile of rows; from
  there on (prefill) the weight is widened to fp32 by C a slice of output channels at a
  time and multiplied by torch's GEMM, whose fp32 throughput the decoding kernel does
  not reach once the rows are many.
- w4a8_linear (W4A8, 4-bit codes): x quantized per token to int8 (kernels/w4a8.py, the
  definition) and exact integer dot products per group; kernels/dispatch.py sends rows
  to it from kernels/cpu/features.py's W4A8_MIN_ROWS up, on CPUs with int8 dot products.

x's input_order is applied here (index_select), before the C kernels see x. 8-bit codes
in groups that are not a multiple of 16 values go to the torch linear (the vector loops
step 16 values).
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from kernels import group_quant
from kernels.cpu.build import function
from kernels.group_quant import GroupQuantized

# From this many rows up torch's GEMM over a widened weight beats the decoding kernel.
GEMM_MIN_ROWS = 32
# fp32 values widened at a time for the GEMM path: a slice that stays in L2 while the
# GEMM reads it
WIDEN_VALUES = 1 << 17


class _Weight(ctypes.Structure):
    """group_linear.c's gq_weight."""
    _fields_ = [("codes", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("offsets", ctypes.c_void_p),
                ("scale_super", ctypes.c_void_p), ("offset_super", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("group", ctypes.c_int64),
                ("super_every", ctypes.c_int64), ("bits", ctypes.c_int32), ("half_scales", ctypes.c_int32),
                ("half_offsets", ctypes.c_int32)]


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_WEIGHT = ctypes.POINTER(_Weight)
_linear_f32 = function("group_linear", "group_linear_f32", [_P, _I64, _WEIGHT, _P, _P, _I64, _INT], restype=_INT)
_dequantize = function("group_linear", "group_dequantize", [_WEIGHT, _I64, _I64, _P, _INT], restype=_INT)
_quantize_x = function("group_linear", "group_quantize_x", [_P, _I64, _I64, _I64, _P, _P, _P, _INT])
_linear_a8 = function("group_linear", "group_linear_a8", [_P, _P, _P, _WEIGHT, _P, _P, _I64, _INT],
                      restype=_INT)


def _pointer(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _weight(w: GroupQuantized) -> tuple[_Weight, list[torch.Tensor]]:
    """The C view of w, and the contiguous tensors it points into (kept alive by the caller)."""
    parts = {name: None if (t := getattr(w, name)) is None else t.contiguous() for name in group_quant.PARTS}
    n, k = w.shape
    half = torch.float16
    view = _Weight(codes=_pointer(parts["codes"]), scales=_pointer(parts["scales"]),
                   offsets=_pointer(parts["offsets"]), scale_super=_pointer(parts["scale_super"]),
                   offset_super=_pointer(parts["offset_super"]), n=n, k=k, group=w.group,
                   super_every=w.super_every, bits=w.bits, half_scales=w.scales.dtype == half,
                   half_offsets=w.offsets is not None and w.offsets.dtype == half)
    return view, [t for t in parts.values() if t is not None]


def _view(w: GroupQuantized) -> _Weight:
    """w's C view, made on first use and kept with the weight (with the tensors it points
    into): a decode step calls each weight's kernel once per layer, and building the view
    took as long as a small layer's arithmetic."""
    found = w.derived.get("cpu")
    if found is None:
        found = w.derived["cpu"] = _weight(w)
    view: _Weight = found[0]
    return view


def _in_c(x: torch.Tensor, w: GroupQuantized) -> bool:
    return x.device.type == "cpu" and w.codes.device.type == "cpu" and (w.bits == 4 or w.group % 16 == 0)


def _rows(x: torch.Tensor, w: GroupQuantized) -> torch.Tensor:
    """x as fp32 [T, K] rows of unit column stride, in the weight's input order."""
    if x.dim() == 2 and w.input_order is None and x.dtype == torch.float32 and x.stride(-1) == 1:
        return x                           # a decode step's rows, as they come
    x2 = group_quant.order_input(x.reshape(-1, w.shape[1]), w)
    return x2 if x2.dtype == torch.float32 and x2.stride(-1) == 1 else x2.float().contiguous()


def _bias(bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if bias is None else bias.to(torch.float32).contiguous()


def group_linear(x: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x's dtype; sums in fp32."""
    if not _in_c(x, w):
        return group_quant.linear(x, w, bias)
    n = w.shape[0]
    x2 = _rows(x, w)
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], n)
    fn = widened_linear if x2.shape[0] >= GEMM_MIN_ROWS else decoded_linear
    out = fn(x2, w, bias)
    return out if x.dim() == 2 and x.dtype == torch.float32 else out.to(x.dtype).reshape(*x.shape[:-1], n)


def decoded_linear(x2: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The decoding kernel: x2 fp32 [T > 0, K] of unit column stride, in w's input order
    -> fp32 [T, N]."""
    view = _view(w)
    b = _bias(bias)
    out = torch.empty(x2.shape[0], view.n)
    if _linear_f32(x2, x2.stride(0), ctypes.byref(view), b, out,
                   x2.shape[0], torch.get_num_threads()) != 0:
        raise MemoryError("group_linear: no memory for the per-thread group scales")
    return out


def widened_linear(x2: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch's GEMM over w widened to fp32 by C, WIDEN_VALUES at a time; x2 as for
    decoded_linear. Each slice of channels fills rows of out's transpose, contiguous, so
    the GEMM writes its result in place (a column slice of out would be a copy)."""
    n, k = w.shape
    step = max(16, WIDEN_VALUES // k)
    out_t = torch.empty(n, x2.shape[0])
    for start in range(0, n, step):
        stop = min(n, start + step)
        torch.mm(dequantize(w, start, stop), x2.T, out=out_t[start:stop])
    out = out_t.T.contiguous()
    if bias is not None:
        out += bias.float()
    return out


def dequantize(w: GroupQuantized, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
    """Output channels start..stop of w as fp32 [stop - start, K], in the weight's own K
    order (kernels/group_quant.py:dequantize, by C)."""
    n, k = w.shape
    stop = n if stop is None else stop
    out = torch.empty(stop - start, k)
    if _dequantize(ctypes.byref(_view(w)), start, stop, out, torch.get_num_threads()) != 0:
        raise MemoryError("group_linear: no memory for the per-thread group scales")
    return out


def w4a8_linear(x: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x's dtype, kernels/w4a8.py:w4a8_linear_ref's definition;
    8-bit codes take group_linear."""
    if w.bits != 4 or not _in_c(x, w):
        return group_linear(x, w, bias)
    n, k = w.shape
    x2 = _rows(x, w)
    rows = x2.shape[0]
    if rows == 0:
        return x.new_empty(*x.shape[:-1], n)
    k_pad = -(-k // 64) * 64
    xq = torch.empty(rows, k_pad, dtype=torch.int8)
    xscale, xsum = torch.empty(rows), torch.empty(rows, k_pad // 32)
    threads = torch.get_num_threads()
    _quantize_x(x2, x2.stride(0), rows, k, xq, xscale, xsum, threads)
    b = _bias(bias)
    out = torch.empty(rows, n)
    if _linear_a8(xq, xscale, xsum, ctypes.byref(_view(w)), b,
                  out, rows, threads) != 0:
        raise MemoryError("w4a8_linear: no memory for the per-thread block scales")
    return out.to(x.dtype).reshape(*x.shape[:-1], n)
