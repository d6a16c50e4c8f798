"""kernels/fp8.py's native path off the GPU: the per-token activation quantization against
vLLM's definition, fp8_linear through this torch's CPU torch._scaled_mm (both its paths:
per-row scales in the matmul for bf16, unit scales and fp32 sums otherwise) against the
definition with the activations so rounded, and which devices count as FP8-capable."""
import pytest
import torch

from kernels import fp8
from kernels.dispatch import get_kernels

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _vllm_per_token(x):
    """vLLM's ref_dynamic_per_token_quant for e4m3 (tests/kernels/quant_utils.py there)."""
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    scales = (x.abs().max(dim=-1).values.float() / fp8_max)[:, None]
    scales = scales.clamp(min=1.0 / (fp8_max * 512.0))
    out = (x.float() * (1.0 / scales)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
    return out, scales


def _x(rows, k, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    # rows of very different magnitudes, one of them all zeros
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 2, rows)[:, None]
    x[rows // 2] = 0
    return x.to(dtype)


def _weight(n, k, per_channel, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(fp8.E4M3)
    scale = torch.rand(n, generator=g) * 1e-3 + 1e-4 if per_channel else torch.tensor(3e-4)
    return fp8.Fp8Weight(values, scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_token_quantization_is_vllms(dtype):
    x = _x(7, 96, dtype)
    q, scale = fp8.quantize_per_token(x)
    want_q, want_scale = _vllm_per_token(x)
    assert q.dtype == fp8.E4M3 and scale.dtype == torch.float32 and scale.shape == (7, 1)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)
    nonzero = x.float().abs().amax(dim=1) > 0
    # each row's largest magnitude lands on 448; a zero row stays zeros (the floor scale)
    assert torch.equal(q.float().abs().amax(dim=1)[nonzero], torch.full((6,), 448.0))
    assert not q.float()[~nonzero].any() and scale[~nonzero].item() == pytest.approx(fp8.MIN_TOKEN_SCALE, rel=1e-7)
    # e4m3 keeps 3 mantissa bits: each value within half a step (2^-4 of it) of x
    err = (q.float() * scale - x.float()).abs()
    assert (err <= x.float().abs() * 2 ** -4 + scale * 2 ** -9).all()


def _expected(x, w, bias):
    """The definition once the activations are rounded to e4m3 as fp8_linear rounds them."""
    q, scale = fp8.quantize_per_token(x.reshape(-1, x.shape[-1]))
    return fp8.linear_ref((q.float() * scale).reshape(x.shape), w, bias).to(x.dtype)


TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_linear_is_the_definition_with_rounded_activations(dtype, per_channel):
    w, x = _weight(48, 160, per_channel), _x(9, 160, dtype)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(3))
    out = fp8.fp8_linear(x, w, bias)
    assert out.dtype == dtype and out.shape == (9, 48)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, _expected(x, w, bias), rtol=tol, atol=tol)
    # against the unrounded activations: e4m3's error, a few percent
    exact = fp8.linear_ref(x, w, bias).float()
    assert (out.float() - exact).norm() / exact.norm() < 0.04


def test_leading_dims_no_bias_and_mismatch():
    w, x = _weight(32, 64, True), _x(6, 64, torch.bfloat16).reshape(2, 3, 64)
    out = fp8.fp8_linear(x, w)
    assert out.shape == (2, 3, 32)
    torch.testing.assert_close(out, _expected(x, w, None), rtol=8e-3, atol=8e-3)
    with pytest.raises(ValueError, match="features"):
        fp8.fp8_linear(torch.randn(2, 48), w)


def _gpu(monkeypatch, capability):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def test_native_where_the_gpu_multiplies_fp8(monkeypatch):
    assert not fp8.native("cpu")
    if not torch.cuda.is_available():
        assert not fp8.native("cuda")                 # asks no GPU that is not there
    for capability, native, rowwise in (((8, 0), False, False), ((8, 6), False, False),
                                        ((8, 9), True, False), ((9, 0), True, True), ((10, 0), True, True)):
        _gpu(monkeypatch, capability)
        assert fp8.native(torch.device("cuda", 0)) is native, capability
        assert fp8.rowwise(torch.device("cuda", 0)) is rowwise, capability
    assert fp8.rowwise(torch.device("cpu"))


def test_the_cuda_kernel_set_takes_fp8_linear_where_native(monkeypatch):
    assert get_kernels("cuda").fp8_linear is fp8.linear_ref
    _gpu(monkeypatch, (9, 0))
    assert get_kernels("cuda").fp8_linear is fp8.fp8_linear
    assert get_kernels("cpu").fp8_linear is fp8.linear_ref
