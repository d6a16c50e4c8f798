"""What the CPU's instruction set allows, and which low-precision GEMMs to use because of it.

read_flags() is the only I/O here: the flags line of /proc/cpuinfo, read once by whoever
builds a kernel set (kernels/dispatch.py:get_kernels) and handed on as CpuFeatures.
plan(features) is a pure decision over them, unit-tested with any flags:

- fp32 models: linear layers in bf16 through oneDNN where the CPU multiplies bf16 natively
  (avx512_bf16 or amx_bf16); fp32 through oneDNN everywhere else. Where the CPU lacks
  them, oneDNN and torch emulate bf16 far slower than fp32 GEMMs, so fp32 stays.
- quantization="int8" (int8 weights): W8A8, int8 activations quantized per token at run
  time, from W8A8_MIN_ROWS rows of x up (prefill, batched decode) where the CPU has int8
  dot products (avx512_vnni, avx_vnni or amx_int8); the weight-only kernel for fewer rows
  (batch-1 decode reads each weight byte once either way, and keeps x in fp32) and on
  every other CPU, where oneDNN's int8 GEMM runs far slower than the weight-only one.
- group-quantized 4-bit weights (kernels/group_quant.py): W4A8, int8 activations against
  the 4-bit codes (kernels/cpu/group_linear.py), from W4A8_MIN_ROWS rows of x up where the
  CPU has int8 dot products of its own vectors (avx512_vnni or avx_vnni: the C kernel's
  vpdpbusd); the weight-only (W4A16) kernel below that and on every other CPU.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

CPUINFO = Path("/proc/cpuinfo")

# From a few rows up the weight-only kernel is bound by its fp32 FMAs on widened weights
# rather than by memory, and a VNNI instruction does 4 int8 multiply-adds per lane where an
# FMA does one; 8 rows is where W8A8 drew level on SmolLM2's larger layers on an AMX Xeon
# (benchmarks/results/code_figures.md). Below it, a decode step of a few sequences keeps
# the weight-only kernel.
W8A8_MIN_ROWS = 8
# The W4A8 kernel quantizes x and pays a conversion and a multiply-add per 32-value
# block on top of each integer dot product (the conversion shares a port with the dot
# products): below 24 rows the W4A16 kernel is ahead on SmolLM2's shapes; from there W4A8
# draws level on the narrow ones and is ahead where K is larger (down_proj's 1536), as
# larger models' layers are (benchmarks/group_linear.py).
W4A8_MIN_ROWS = 24


@dataclass(frozen=True)
class CpuFeatures:
    """The flags that choose a GEMM; each field is named as /proc/cpuinfo spells the flag.
    CpuFeatures() is a CPU with none of them: it keeps the fp32 and weight-only paths."""
    avx512_bf16: bool = False
    amx_bf16: bool = False
    avx512_vnni: bool = False
    avx_vnni: bool = False
    amx_int8: bool = False
    # oneDNN's packed bf16 weights need these (torch's mkldnn._reorder_linear_weight says so)
    avx512bw: bool = False
    avx512vl: bool = False
    avx512dq: bool = False
    avx_ne_convert: bool = False

    @classmethod
    def from_flags(cls, flags: Iterable[str]) -> "CpuFeatures":
        have = set(flags)
        return cls(**{f.name: f.name in have for f in fields(cls)})

    @property
    def bf16_gemm(self) -> bool:
        return self.avx512_bf16 or self.amx_bf16

    @property
    def int8_gemm(self) -> bool:
        return self.avx512_vnni or self.avx_vnni or self.amx_int8

    @property
    def int8_dot(self) -> bool:
        """vpdpbusd on the vector registers (AMX's tiles are another unit)."""
        return self.avx512_vnni or self.avx_vnni

    @property
    def bf16_packable(self) -> bool:
        """oneDNN can reorder a bf16 weight into its blocked layout on this CPU."""
        return (self.avx512bw and self.avx512vl and self.avx512dq) or self.avx_ne_convert


def read_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first "flags" line of a /proc/cpuinfo-style file; none if there is no such file
    (not Linux): no flags means today's fp32 and weight-only paths."""
    try:
        # line by line, stopping at the first CPU's flags: the kernel generates the file
        # CPU by CPU (sampling each one's clock), which takes long on a many-core host
        with cpuinfo.open() as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except FileNotFoundError:
        pass
    return frozenset()


def detect(cpuinfo: Path = CPUINFO) -> CpuFeatures:
    return CpuFeatures.from_flags(read_flags(cpuinfo))


class LinearPath(enum.Enum):
    FP32 = "fp32"          # oneDNN, prepacked fp32 weights (kernels/cpu/linear.py)
    BF16 = "bf16"          # oneDNN, bf16 weights, x rounded to bf16 (kernels/cpu/bf16_linear.py)


@dataclass(frozen=True)
class LowPrecisionPlan:
    linear: LinearPath                 # float weights
    w8a8_min_rows: Optional[int]       # int8 weights: W8A8 from this many rows of x; None: never
    w4a8_min_rows: Optional[int]       # group-quantized 4-bit weights: W4A8 from this many rows


def plan(features: CpuFeatures) -> LowPrecisionPlan:
    return LowPrecisionPlan(linear=LinearPath.BF16 if features.bf16_gemm else LinearPath.FP32,
                            w8a8_min_rows=W8A8_MIN_ROWS if features.int8_gemm else None,
                            w4a8_min_rows=W4A8_MIN_ROWS if features.int8_dot else None)

