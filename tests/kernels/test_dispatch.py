"""kernels/dispatch.py: which implementation a device gets."""
import subprocess
import sys

import pytest

from kernels import activation, attention, fp8, group_quant, int8, linear, lora, rmsnorm, rotary
from kernels.dispatch import KernelSet, reference_kernels, get_kernels
from kernels.cpu.features import CpuFeatures


def test_the_reference_set():
    # what CUDA without triton gets; a CPU without a C compiler gets it with oneDNN's linear
    # (tests/kernels/test_cpu_build.py)
    assert reference_kernels() == KernelSet(backend="torch", rms_norm=rmsnorm.rms_norm,
                                         fused_add_rms_norm=rmsnorm.fused_add_rms_norm,
                                         apply_rotary=rotary.apply_rotary, write_kv=attention.write_kv,
                                         lora_delta=lora.lora_delta,
                                         paged_decode_attention=attention.paged_decode_attention,
                                         paged_prefill_attention=attention.paged_prefill_attention,
                                         prefill_attention=attention.prefill_attention,
                                         int8_linear=int8.int8_linear,
                                         group_linear=group_quant.linear,
                                         fp8_linear=fp8.linear_ref,
                                         silu_and_mul=activation.silu_and_mul,
                                         gelu_and_mul=activation.gelu_and_mul,
                                         pack_linear=linear.pack, linear=linear.linear)


def test_cuda_gets_triton_when_it_imports():
    pytest.importorskip("triton", reason="triton not installed")
    from kernels.triton import activation as triton_activation
    from kernels.triton import group_linear, int8_matmul, paged_attention
    from kernels.triton import rmsnorm as triton_rmsnorm
    from kernels.triton import rotary as triton_rotary

    # Choosing needs no GPU: the device says what the engine will run on.
    import torch
    ks = get_kernels(torch.device("cuda", 0))
    assert ks.backend == "triton"
    assert ks.rms_norm is triton_rmsnorm.rms_norm
    assert ks.fused_add_rms_norm is triton_rmsnorm.fused_add_rms_norm
    assert ks.apply_rotary is triton_rotary.apply_rotary
    assert ks.paged_decode_attention is paged_attention.paged_decode_attention
    assert ks.int8_linear is int8_matmul.int8_linear
    assert ks.group_linear is group_linear.group_linear
    assert ks.silu_and_mul is triton_activation.silu_and_mul
    # no GPU here to ask: FP8 weights keep the definition (a GPU of 8.9 on: test_fp8.py)
    assert ks.fp8_linear is fp8.linear_ref


def test_cuda_without_triton_falls_back(monkeypatch):
    # None in sys.modules makes `import triton` raise ImportError.
    ours = ("triton", "kernels.triton")
    for name in [m for m in sys.modules if m in ours or m.startswith(tuple(p + "." for p in ours))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)
    assert get_kernels("cuda").backend == "torch"


def test_importing_dispatch_imports_no_triton():
    code = "import sys, kernels.dispatch; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_asking_whether_w8a8_runs_builds_no_w8a8_kernel():
    """A plain int8 model asks every_channel_w8a8 at every load (CUDA and compiler-less
    CPUs too): answering must not import, hence compile, kernels/cpu/w8a8_quant.c."""
    code = ("import sys\nfrom kernels.dispatch import every_channel_w8a8, reference_kernels\n"
            "assert every_channel_w8a8(reference_kernels()) is None\n"
            "print('kernels.cpu.w8a8_linear' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cpu_gets_the_c_kernels_and_onednn():
    from kernels.cpu import build

    if build.compiler() is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build kernels/cpu")
    from kernels.cpu import activation, group_linear, int8_matmul, linear, paged_attention, rmsnorm, rotary

    # a CPU with no bf16 or int8 GEMM flags (test_cpu_features.py checks what those change)
    ks = get_kernels("cpu", features=CpuFeatures())
    assert ks.backend == "cpu"
    assert ks.paged_decode_attention is paged_attention.paged_decode_attention
    assert ks.paged_prefill_attention is paged_attention.paged_prefill_attention
    assert ks.prefill_attention is paged_attention.prefill_attention
    assert ks.rms_norm is rmsnorm.rms_norm
    assert ks.fused_add_rms_norm is rmsnorm.fused_add_rms_norm
    assert ks.apply_rotary is rotary.apply_rotary
    assert ks.silu_and_mul is activation.silu_and_mul
    assert ks.int8_linear is int8_matmul.int8_linear
    assert ks.group_linear is group_linear.group_linear
    assert ks.pack_linear is linear.pack and ks.linear is linear.linear


def test_w4a8_for_many_rows_only_where_the_cpu_has_vnni():
    """Group-quantized 4-bit weights under low precision: W4A8 from W4A8_MIN_ROWS rows of x
    where the vectors multiply int8 (avx512_vnni, avx_vnni), the weight-only kernel below
    that and on CPUs without (AMX's int8 tiles alone do not run the C kernel's vpdpbusd)."""
    from kernels.cpu import build

    if build.compiler() is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build kernels/cpu")
    import torch

    from kernels.cpu import group_linear
    from kernels.cpu.features import W4A8_MIN_ROWS
    from kernels.dispatch import RowSplit

    for flags in (CpuFeatures(avx512_vnni=True), CpuFeatures(avx_vnni=True)):
        split = get_kernels("cpu", features=flags).group_linear
        assert split == RowSplit(few=group_linear.group_linear, many=group_linear.w4a8_linear,
                                 min_rows=W4A8_MIN_ROWS)
    for flags in (CpuFeatures(), CpuFeatures(amx_int8=True), CpuFeatures(avx512_bf16=True)):
        assert get_kernels("cpu", features=flags).group_linear is group_linear.group_linear
    assert get_kernels("cpu").group_linear is group_linear.group_linear

    codes = group_quant.pack_nibbles(torch.randint(0, 16, (8, 64)))
    w = group_quant.GroupQuantized(codes=codes, scales=torch.rand(8, 2) * 0.1, bits=4, group=32)
    split = get_kernels("cpu", features=CpuFeatures(avx512_vnni=True)).group_linear
    few, many = torch.randn(W4A8_MIN_ROWS - 1, 64), torch.randn(W4A8_MIN_ROWS, 64)
    assert split(few, w).equal(group_linear.group_linear(few, w))
    assert split(many, w).equal(group_linear.w4a8_linear(many, w))


def test_every_channel_w8a8_only_where_w8a8_runs():
    """For int8 weights smoothed at load: the W8A8 side of the row split keeps no channel
    apart; a kernel set without W8A8 gets None (its weights are not smoothed)."""
    from kernels.cpu import build

    if build.compiler() is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build kernels/cpu")
    from kernels.cpu import w8a8_linear
    from kernels.dispatch import RowSplit, every_channel_w8a8

    assert every_channel_w8a8(get_kernels("cpu", features=CpuFeatures())) is None
    assert every_channel_w8a8(reference_kernels()) is None
    if not w8a8_linear.available():
        pytest.skip("this torch has no torch._int_mm")
    split = get_kernels("cpu", features=CpuFeatures(avx512_vnni=True)).int8_linear
    ks = every_channel_w8a8(get_kernels("cpu", features=CpuFeatures(avx512_vnni=True)))
    assert ks is not None
    every = ks.int8_linear
    assert isinstance(every, RowSplit) and every.few is split.few and every.min_rows == split.min_rows
    assert every.many.func is w8a8_linear.w8a8_linear and every.many.keywords == {"outliers": 0}
