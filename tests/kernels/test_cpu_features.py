"""kernels/cpu/features.py (the CPU's flags -> which GEMMs) and how kernels/dispatch.py wires
the choice in. Any flags can be passed, so every branch is checked on any machine."""
import pytest
import torch

from kernels.cpu import build
from kernels.cpu.features import (W4A8_MIN_ROWS, W8A8_MIN_ROWS, CpuFeatures, LinearPath, LowPrecisionPlan, detect, plan,
                                  read_flags)
from kernels.dispatch import RowSplit, get_kernels

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16 amx_bf16 amx_int8
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu sse2
"""

needs_c = pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc or gcc) on PATH to build kernels/cpu")


def test_read_flags_takes_the_first_flags_line(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    flags = read_flags(path)
    assert {"avx2", "avx512_bf16", "amx_int8"} <= flags and "fpu" in flags
    assert "spectre_v1" not in flags and "GenuineIntel" not in flags
    assert CpuFeatures.from_flags(flags) == CpuFeatures(
        avx512_bf16=True, amx_bf16=True, avx512_vnni=True, amx_int8=True,
        avx512bw=True, avx512vl=True, avx512dq=True)


def test_no_cpuinfo_means_no_flags(tmp_path):
    assert read_flags(tmp_path / "absent") == frozenset()
    assert detect(tmp_path / "absent") == CpuFeatures()


FP32_WEIGHT_ONLY = LowPrecisionPlan(LinearPath.FP32, None, None)


@pytest.mark.parametrize("flags,expected", [
    ((), FP32_WEIGHT_ONLY),
    (("avx", "avx2", "fma", "f16c"), FP32_WEIGHT_ONLY),                      # the EPYC this builds on
    (("avx512f", "avx512bw", "avx512vl", "avx512dq"), FP32_WEIGHT_ONLY),     # Skylake: no bf16, no VNNI
    (("avx_ne_convert",), FP32_WEIGHT_ONLY),                                 # converts, no bf16 GEMM
    (("avx512_bf16",), LowPrecisionPlan(LinearPath.BF16, None, None)),
    (("amx_bf16",), LowPrecisionPlan(LinearPath.BF16, None, None)),
    (("avx512_vnni",), LowPrecisionPlan(LinearPath.FP32, W8A8_MIN_ROWS, W4A8_MIN_ROWS)),    # Cascade Lake
    (("avx_vnni",), LowPrecisionPlan(LinearPath.FP32, W8A8_MIN_ROWS, W4A8_MIN_ROWS)),       # Alder Lake
    (("amx_int8",), LowPrecisionPlan(LinearPath.FP32, W8A8_MIN_ROWS, None)),   # tiles only: no vpdpbusd
    (("avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"),
     LowPrecisionPlan(LinearPath.BF16, W8A8_MIN_ROWS, W4A8_MIN_ROWS)),
])
def test_plan(flags, expected):
    assert plan(CpuFeatures.from_flags(flags)) == expected


@pytest.mark.parametrize("flags,packable", [
    (("avx512bw", "avx512vl", "avx512dq"), True), (("avx_ne_convert",), True),
    (("avx512bw", "avx512vl"), False), ((), False)])
def test_bf16_packable(flags, packable):
    assert CpuFeatures.from_flags(flags).bf16_packable is packable


# ---- wiring (kernels/dispatch.py)


@needs_c
def test_no_flags_keep_todays_paths():
    from kernels.cpu import int8_matmul, linear

    ks = get_kernels("cpu", features=CpuFeatures())
    assert ks.linear is linear.linear and ks.pack_linear is linear.pack
    assert ks.int8_linear is int8_matmul.int8_linear


def test_by_default_no_low_precision_whatever_the_cpu():
    # an fp32 model's results must not change with the machine unless the engine asks
    # (cpu_low_precision): the default is today's paths
    assert get_kernels("cpu") == get_kernels("cpu", features=CpuFeatures())


def test_this_cpu_without_the_instructions_gets_todays_paths():
    here = detect()
    if here.bf16_gemm or here.int8_gemm:
        pytest.skip("this CPU has bf16 or int8 GEMM instructions")
    assert get_kernels("cpu", features=here) == get_kernels("cpu", features=CpuFeatures())


@pytest.mark.parametrize("packable", [False, True])
def test_bf16_flags_give_bf16_linear(packable):
    from kernels.cpu import bf16_linear

    blocked = dict(avx512bw=True, avx512vl=True, avx512dq=True) if packable else {}
    ks = get_kernels("cpu", features=CpuFeatures(avx512_bf16=True, **blocked))
    assert ks.linear is bf16_linear.linear
    assert ks.pack_linear is (bf16_linear.pack if packable else bf16_linear.pack_unblocked)
    assert ks.int8_linear is get_kernels("cpu", features=CpuFeatures()).int8_linear


@needs_c
def test_vnni_flags_give_w8a8_over_many_rows():
    from kernels.cpu import int8_matmul, linear, w8a8_linear

    ks = get_kernels("cpu", features=CpuFeatures(avx512_vnni=True))
    assert ks.int8_linear == RowSplit(few=int8_matmul.int8_linear, many=w8a8_linear.w8a8_linear,
                                      min_rows=W8A8_MIN_ROWS)
    assert ks.linear is linear.linear


def test_the_forced_sets_run_a_quantized_and_a_float_layer():
    """Through runtime/load/quantization.py:linear, as the model calls them."""
    from kernels import int8
    from runtime.load.quantization import Int8Weight, linear

    w, bias = torch.randn(64, 128), torch.randn(64)
    ops = get_kernels("cpu", features=CpuFeatures(avx512_bf16=True, amx_int8=True))
    qweight, scale = int8.quantize_per_channel(w)
    for rows in (1, W8A8_MIN_ROWS, 40):
        x = torch.randn(rows, 128)
        out = linear(x, Int8Weight(qweight, scale), bias, ops)
        expected = (int8.w8a8_linear_ref if rows >= W8A8_MIN_ROWS else int8.int8_linear_ref)(x, qweight, scale, bias)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        # bf16 rounds the product before the fp32 bias goes on: compared without the bias,
        # so that a bias cancelling a large product does not turn its rounding into a
        # large relative error
        out = linear(x, ops.pack_linear(w), bias, ops)
        torch.testing.assert_close(out - bias, x @ w.T, rtol=0.02, atol=0.1)
