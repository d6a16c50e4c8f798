"""Choose the kernel implementations for a device, explicitly: the engine passes
its device and gets a KernelSet back; nothing reads the environment.

On a CUDA device with triton importable: the Triton kernels of kernels/triton/; on one
with FP8 matmuls (compute capability 8.9 on), FP8 weights as they are (kernels/fp8.py).
On the CPU: linear layers through oneDNN with prepacked weights, and the C
kernels of kernels/cpu/ where they build (a C compiler is on PATH), the
pure-torch references for the rest; and low-precision GEMMs where the CPU's flags
allow (kernels/cpu/features.py): bf16 linear layers with avx512_bf16 or amx_bf16,
W8A8 for int8 weights over many rows with avx512_vnni, avx_vnni or amx_int8, and W4A8
for group-quantized 4-bit weights over many rows with avx512_vnni or avx_vnni. Anywhere
else (CUDA without triton, a CPU with no compiler): the references, which are the
definitions the faster kernels are tested against. A fallback is logged with its reason.

Importing this module imports torch and the references only; triton is
imported inside get_kernels, and only for a CUDA device. Low precision is the
caller's choice: get_kernels uses the CPU capabilities it is given (`features`; the
engine passes the CPU's own flags under cpu_low_precision, a test made-up ones), none
by default, so an fp32 model's results do not change with the machine.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

if TYPE_CHECKING:
    from kernels.cpu.features import CpuFeatures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelSet:
    backend: str                        # "triton", "cpu" (C kernels + references) or "torch"
    rms_norm: Callable                  # (x [T,H], weight [H], eps) -> [T,H]
    fused_add_rms_norm: Callable        # (x, residual, weight, eps) -> (normed, residual_out)
    apply_rotary: Callable              # (x [T,n,D], cos [T,D/2], sin [T,D/2]) -> [T,n,D]
    write_kv: Callable                  # (k [T,nkv,D], v, k_cache, v_cache, slot_mapping [T] long) -> None
    lora_delta: Callable                # (x [T,K], a [L,R,K], b [L,R,N], slots [T] long, splits=()) -> [T,N] fp32
    paged_decode_attention: Callable    # (q [B,nh,D], k_cache, v_cache, block_tables, context_lens, scale,
                                        #  window=None, softcap=None)
    paged_prefill_attention: Callable   # (q [T,nh,D], k_cache, v_cache, block_tables, query_lens, context_lens,
                                        #  scale, window=None, softcap=None); kernels/attention.py
    prefill_attention: Callable         # (q [T,nh,D], k [T,nkv,D], v, query_lens, scale, window=None,
                                        #  softcap=None): nothing cached yet
    int8_linear: Callable               # (x [T,K], qweight [N,K] int8, scale [N], bias=None) -> [T,N]
    group_linear: Callable              # (x [T,K], kernels.group_quant.GroupQuantized [N,K], bias=None)
                                        #  -> [T,N]
    fp8_linear: Callable                # (x [T,K], kernels.fp8.Fp8Weight [N,K], bias=None) -> [T,N]: the
                                        #  native one where the GPU multiplies FP8, else the definition
    silu_and_mul: Callable              # (x [T,2I]) -> [T,I]
    gelu_and_mul: Callable              # (x [T,2I]) -> [T,I]  (GeGLU; the reference everywhere)
    pack_linear: Callable               # (weight [N,K]) -> what `linear` takes, once at load
    linear: Callable                    # (x [T,K], packed weight, bias=None) -> [T,N]


Int8Linear = Callable[..., torch.Tensor]   # (x, qweight, scale, bias=None) -> out, or group_linear's


@dataclass(frozen=True)
class RowSplit:
    """An int8_linear or group_linear that sends x with min_rows rows or more to `many`,
    fewer to `few` (the low-precision plan: W8A8 or W4A8 for many rows, weight-only for
    few). Here, with no C behind it, so that asking whether a kernel set splits builds
    nothing."""
    few: Int8Linear
    many: Int8Linear
    min_rows: int

    def __call__(self, x: torch.Tensor, *weight: object, **kwargs: object) -> torch.Tensor:
        rows = math.prod(x.shape[:-1])
        fn = self.many if rows >= self.min_rows else self.few
        return fn(x, *weight, **kwargs)


def get_kernels(device: torch.device | str, features: Optional[CpuFeatures] = None) -> KernelSet:
    """features: the CPU capabilities the low-precision GEMMs may use (the engine's
    cpu_low_precision passes this CPU's, kernels/cpu/features.py:detect); None: none,
    so fp32 models compute in fp32 and int8 ones keep their activations in fp32."""
    if torch.device(device).type == "cuda":
        return _with_native_fp8(_triton_kernels() or reference_kernels(), device)
    if features is None:
        return _cpu_kernels()
    return _low_precision(_cpu_kernels(), features)


def reference_kernels() -> KernelSet:
    from kernels import activation, attention, fp8, group_quant, int8, linear, lora, rmsnorm, rotary

    return KernelSet(backend="torch", rms_norm=rmsnorm.rms_norm,
                     fused_add_rms_norm=rmsnorm.fused_add_rms_norm,
                     apply_rotary=rotary.apply_rotary, write_kv=attention.write_kv,
                     lora_delta=lora.lora_delta,
                     paged_decode_attention=attention.paged_decode_attention,
                     paged_prefill_attention=attention.paged_prefill_attention,
                     prefill_attention=attention.prefill_attention,
                     int8_linear=int8.int8_linear, group_linear=group_quant.linear,
                     fp8_linear=fp8.linear_ref,
                     silu_and_mul=activation.silu_and_mul,
                     gelu_and_mul=activation.gelu_and_mul,
                     pack_linear=linear.pack, linear=linear.linear)


def _cpu_kernels() -> KernelSet:
    from kernels.cpu import linear
    from kernels.cpu.build import NativeUnavailable

    # oneDNN's prepacked linear is torch's own: it needs no compiler
    with_onednn = dataclasses.replace(reference_kernels(), pack_linear=linear.pack, linear=linear.linear)
    try:
        from kernels.cpu import activation, group_linear, int8_matmul, lora, paged_attention, rmsnorm, rotary
    except NativeUnavailable as exc:
        log.warning("CPU C kernels unavailable, using the torch references: %s", exc)
        return with_onednn
    return dataclasses.replace(with_onednn, backend="cpu", rms_norm=rmsnorm.rms_norm,
                               fused_add_rms_norm=rmsnorm.fused_add_rms_norm,
                               apply_rotary=rotary.apply_rotary, write_kv=paged_attention.write_kv,
                               lora_delta=lora.lora_delta,
                               paged_decode_attention=paged_attention.paged_decode_attention,
                               paged_prefill_attention=paged_attention.paged_prefill_attention,
                               prefill_attention=paged_attention.prefill_attention,
                               int8_linear=int8_matmul.int8_linear,
                               group_linear=group_linear.group_linear,
                               silu_and_mul=activation.silu_and_mul)


def _low_precision(kernels: KernelSet, features: CpuFeatures) -> KernelSet:
    """`kernels` with the linear layers kernels/cpu/features.py:plan picks for `features`."""
    from kernels.cpu import bf16_linear, w8a8_linear
    from kernels.cpu.features import CpuFeatures, LinearPath, plan

    chosen = plan(features)
    if chosen.linear is LinearPath.BF16:
        pack = bf16_linear.pack if features.bf16_packable else bf16_linear.pack_unblocked
        kernels = dataclasses.replace(kernels, pack_linear=pack, linear=bf16_linear.linear)
    if chosen.w8a8_min_rows is not None and w8a8_linear.available():
        split = RowSplit(few=kernels.int8_linear, many=w8a8_linear.w8a8_linear,
                         min_rows=chosen.w8a8_min_rows)
        kernels = dataclasses.replace(kernels, int8_linear=split)
    if chosen.w4a8_min_rows is not None and kernels.backend == "cpu":
        from kernels.cpu import group_linear     # built already: the C kernel set has it

        kernels = dataclasses.replace(kernels, group_linear=RowSplit(
            few=kernels.group_linear, many=group_linear.w4a8_linear, min_rows=chosen.w4a8_min_rows))
    if chosen != plan(CpuFeatures()):
        log.info("CPU low-precision GEMMs: %s", chosen)
    return kernels


def every_channel_w8a8(kernels: KernelSet) -> Optional[KernelSet]:
    """`kernels` whose W8A8 quantizes every input channel, keeping none apart in fp32: for
    int8 weights smoothed at load (runtime/load/smoothing.py), whose activations have no
    outlier channels left. None when `kernels` runs no W8A8 (no int8 dot products, or
    low precision not asked for): the weights then stay as they are."""
    split = kernels.int8_linear
    if not isinstance(split, RowSplit):
        return None
    from kernels.cpu import w8a8_linear     # built already: the split runs it

    every = functools.partial(w8a8_linear.w8a8_linear, outliers=0)
    return dataclasses.replace(kernels, int8_linear=dataclasses.replace(split, many=every))


def _triton_kernels() -> KernelSet | None:
    try:
        from kernels.triton import (activation, group_linear, int8_matmul, lora, paged_attention, rmsnorm,
                                    rotary)
    except ImportError:   # triton not installed: the references serve CUDA too
        return None
    return dataclasses.replace(reference_kernels(), backend="triton", rms_norm=rmsnorm.rms_norm,
                               fused_add_rms_norm=rmsnorm.fused_add_rms_norm,
                               apply_rotary=rotary.apply_rotary,
                               paged_decode_attention=paged_attention.paged_decode_attention,
                               int8_linear=int8_matmul.int8_linear,
                               group_linear=group_linear.group_linear, lora_delta=lora.lora_delta,
                               silu_and_mul=activation.silu_and_mul)


def _with_native_fp8(kernels: KernelSet, device: torch.device | str) -> KernelSet:
    """A GPU with FP8 matmuls runs FP8 weights as they are (no triton needed: cuBLAS)."""
    from kernels import fp8

    return dataclasses.replace(kernels, fp8_linear=fp8.fp8_linear) if fp8.native(device) else kernels


def batch_invariant_kernels(kernels: KernelSet) -> KernelSet:
    """`kernels` with its linear layers summed in one fixed order whatever the batch
    (kernels/cpu/invariant_linear.c), for the engine's batch-invariant mode. The other CPU
    kernels already are: norms, rotary and activations work row by row, and attention sums
    each query's keys in tiles fixed by position (the engine sends every row through the
    prefill kernel in that mode). Needs the C kernels: without them there is no such mode."""
    if kernels.backend != "cpu":
        raise ValueError(f"batch_invariant: needs the CPU's C kernels, not the {kernels.backend!r} set")
    from kernels.cpu import invariant_linear

    return dataclasses.replace(kernels, pack_linear=invariant_linear.pack, linear=invariant_linear.linear)
