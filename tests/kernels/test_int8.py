"""kernels/int8.py: quantization bounds, the fast int8_linear against the definition, Int8Linear."""
import pytest
import torch
from torch import nn

from kernels.int8 import Int8Linear, dequantize, int8_linear, int8_linear_ref, quantize_per_channel


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes, as real layers have: per-channel scales must follow them.
    return torch.randn(n, k, generator=g) * torch.logspace(-3, 0, n)[:, None]


def _rel_err(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def test_quantize_shapes_dtypes_and_range():
    w = _weight(37, 64)
    qweight, scale = quantize_per_channel(w)
    assert qweight.dtype == torch.int8 and qweight.shape == (37, 64)
    assert scale.dtype == torch.float32 and scale.shape == (37,)
    assert qweight.abs().max() <= 127
    # Symmetric: each row's largest magnitude lands exactly on +-127.
    assert torch.equal(qweight.abs().amax(dim=1).int(), torch.full((37,), 127, dtype=torch.int32))
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / 127)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_error_is_at_most_half_a_step_per_element(dtype):
    w = _weight(64, 96).to(dtype)
    qweight, scale = quantize_per_channel(w)
    err = (dequantize(qweight, scale) - w.float()).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5)).all()


def test_zero_rows_stay_zero_and_finite():
    w = _weight(8, 32)
    w[[0, 5]] = 0.0
    qweight, scale = quantize_per_channel(w)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert (qweight[[0, 5]] == 0).all()
    deq = dequantize(qweight, scale)
    assert (deq[[0, 5]] == 0).all() and torch.isfinite(deq).all()
    x = torch.randn(3, 32)
    out = int8_linear(x, qweight, scale)
    assert (out[:, [0, 5]] == 0).all() and torch.isfinite(out).all()


def test_reference_is_x_times_dequantized_weight():
    qweight, scale = quantize_per_channel(_weight(16, 48))
    x, bias = torch.randn(5, 48), torch.randn(16)
    expected = x @ (qweight.float() * scale[:, None]).T + bias
    torch.testing.assert_close(int8_linear_ref(x, qweight, scale, bias), expected, rtol=1e-6, atol=1e-6)


# tokens <= 16 with K % 16 == 0 takes torch's CPU int8 GEMV (bf16 activations);
# the rest takes the matmul-then-scale path. Both are checked against the definition.
@pytest.mark.parametrize("tokens", [1, 4, 16, 17, 40])
@pytest.mark.parametrize("k", [64, 100])
def test_fast_path_fp32_matches_definition(tokens, k):
    qweight, scale = quantize_per_channel(_weight(48, k))
    x, bias = torch.randn(tokens, k), torch.randn(48)
    out = int8_linear(x, qweight, scale, bias)
    expected = int8_linear_ref(x, qweight, scale, bias)
    assert out.dtype == torch.float32 and out.shape == (tokens, 48)
    if tokens <= 16 and k % 16 == 0:
        # bf16 activations: ~2^-9 relative per element, averaged over K.
        assert _rel_err(out, expected) < 4e-3
    else:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 17])
def test_fast_path_half_matches_definition(tokens, dtype):
    qweight, scale = quantize_per_channel(_weight(32, 64))
    x = torch.randn(tokens, 64).to(dtype)
    out = int8_linear(x, qweight, scale)
    assert out.dtype == dtype
    assert _rel_err(out, int8_linear_ref(x, qweight, scale)) < 1e-2


def test_fp16_does_not_overflow_before_scaling():
    # x @ qweight.T alone would be ~127 * 40 * 1024 >> 65504; the true outputs are small.
    qweight, scale = quantize_per_channel(torch.full((4, 1024), 1e-4))
    for tokens in (1, 17):   # both paths
        x = torch.full((tokens, 1024), 40.0, dtype=torch.float16)
        out = int8_linear(x, qweight, scale)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), torch.full((tokens, 4), 4.096), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("tokens", [1, 32])
def test_quantization_error_dominates(tokens):
    # Against the unquantized layer, the fast path is about as good as the definition.
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(3)) * 0.02
    qweight, scale = quantize_per_channel(w)
    x = torch.randn(tokens, 512)
    exact = x @ w.T
    err_fast = _rel_err(int8_linear(x, qweight, scale), exact)
    err_ref = _rel_err(int8_linear_ref(x, qweight, scale), exact)
    assert err_ref < 0.015
    assert err_fast < 1.1 * err_ref


def test_int8_linear_module_from_linear():
    linear = nn.Linear(128, 64, bias=True)
    mod = Int8Linear.from_linear(linear)
    assert mod.qweight.dtype == torch.int8 and mod.scale.dtype == torch.float32
    assert set(mod.state_dict()) == {"qweight", "scale", "bias"}
    assert not list(mod.parameters())
    x = torch.randn(2, 7, 128)
    with torch.no_grad():
        assert _rel_err(mod(x), linear(x)) < 0.02
        assert mod(x).shape == (2, 7, 64)


def test_int8_linear_module_without_bias_in_bf16():
    linear = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    mod = Int8Linear.from_linear(linear)
    assert mod.bias is None and "bias" not in mod.state_dict()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out = mod(x)
        assert out.dtype == torch.bfloat16
        assert _rel_err(out, linear(x)) < 0.03


@pytest.mark.parametrize("dtype,min_ratio", [(torch.float32, 3.5), (torch.bfloat16, 1.9)])
def test_memory(dtype, min_ratio):
    linear = nn.Linear(1024, 512, bias=False).to(dtype)
    mod = Int8Linear.from_linear(linear)
    full = linear.weight.numel() * linear.weight.element_size()
    quant = sum(b.numel() * b.element_size() for b in mod.buffers())
    assert full / quant >= min_ratio
