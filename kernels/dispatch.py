"""Choose the kernel implementations for a device, explicitly: the engine passes
its device and gets a KernelSet back; nothing reads the environment.

On a CUDA device with triton importable: the Triton kernels of kernels/triton/.
Anywhere else (CPU, or CUDA without triton): the pure-torch references, which
are the definitions the Triton kernels are tested against.

Importing this module imports torch and the references only; triton is
imported inside get_kernels, and only for a CUDA device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class KernelSet:
    backend: str                        # "triton" or "torch"
    rms_norm: Callable                  # (x [T,H], weight [H], eps) -> [T,H]
    fused_add_rms_norm: Callable        # (x, residual, weight, eps) -> (normed, residual_out)
    apply_rotary: Callable              # (x [T,n,D], cos [T,D/2], sin [T,D/2]) -> [T,n,D]
    paged_decode_attention: Callable    # (q [B,nh,D], k_cache, v_cache, block_tables, context_lens, scale)
    int8_linear: Callable               # (x [T,K], qweight [N,K] int8, scale [N], bias=None) -> [T,N]


def get_kernels(device: torch.device | str) -> KernelSet:
    if torch.device(device).type == "cuda":
        triton_set = _triton_kernels()
        if triton_set is not None:
            return triton_set
    return _torch_kernels()


def _torch_kernels() -> KernelSet:
    from kernels import attention, int8, rmsnorm, rotary

    return KernelSet(backend="torch", rms_norm=rmsnorm.rms_norm,
                     fused_add_rms_norm=rmsnorm.fused_add_rms_norm,
                     apply_rotary=rotary.apply_rotary,
                     paged_decode_attention=attention.paged_decode_attention,
                     int8_linear=int8.int8_linear)


def _triton_kernels() -> KernelSet | None:
    try:
        from kernels.triton import int8_matmul, paged_attention, rmsnorm, rotary
    except ImportError:   # triton not installed: the references serve CUDA too
        return None
    return KernelSet(backend="triton", rms_norm=rmsnorm.rms_norm,
                     fused_add_rms_norm=rmsnorm.fused_add_rms_norm,
                     apply_rotary=rotary.apply_rotary,
                     paged_decode_attention=paged_attention.paged_decode_attention,
                     int8_linear=int8_matmul.int8_linear)
