"""kernels/triton/int8_matmul.py against kernels/int8.py's definition (interpreter on the CPU)."""
import pytest
import torch

from tests.kernels.triton_support import DEVICE, assert_close

from kernels import int8 as ref
from kernels.triton import int8_matmul as tri


def _layer(n, k, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    qweight, scale = ref.quantize_per_channel(torch.randn(n, k, generator=g) * 0.05)
    b = torch.randn(n, generator=g) if bias else None
    return qweight.to(DEVICE), scale.to(DEVICE), (b.to(DEVICE) if bias else None)


# Rows: 1 (decode), 16 (one full small tile), 17 (one past it), 70 (several 64-row tiles).
# (N, K): whole tiles, ragged N and K, K smaller than one 64-wide step, N < 16.
@pytest.mark.parametrize("tokens", [1, 16, 17, 70])
@pytest.mark.parametrize("n,k", [(64, 64), (70, 96), (33, 200), (8, 16)])
def test_fp32(tokens, n, k):
    qweight, scale, bias = _layer(n, k)
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    assert_close(tri.int8_linear(x, qweight, scale, bias), ref.int8_linear_ref(x, qweight, scale, bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens,bias", [(1, False), (19, True)])
def test_half_precision(tokens, bias, dtype):
    qweight, scale, b = _layer(80, 128, bias=bias)
    x = torch.randn(tokens, 128, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    assert_close(tri.int8_linear(x, qweight, scale, b), ref.int8_linear_ref(x, qweight, scale, b))


def test_leading_dims_and_strided_rows():
    qweight, scale, bias = _layer(24, 48)
    x = torch.randn(2, 3, 48, device=DEVICE)
    out = tri.int8_linear(x, qweight, scale, bias)
    assert out.shape == (2, 3, 24)
    assert_close(out, ref.int8_linear_ref(x, qweight, scale, bias))
    wide = torch.randn(5, 100, device=DEVICE)[:, 10:58]
    assert_close(tri.int8_linear(wide, qweight, scale), ref.int8_linear_ref(wide, qweight, scale))


def test_zero_rows_give_bias():
    qweight, scale = ref.quantize_per_channel(torch.zeros(20, 32))
    bias = torch.arange(20.0)
    x = torch.randn(3, 32)
    out = tri.int8_linear(x.to(DEVICE), qweight.to(DEVICE), scale.to(DEVICE), bias.to(DEVICE))
    torch.testing.assert_close(out.cpu(), bias.expand(3, 20), rtol=0, atol=0)


def test_feature_mismatch_is_refused():
    qweight, scale, _ = _layer(8, 32)
    with pytest.raises(ValueError, match="features"):
        tri.int8_linear(torch.randn(2, 16, device=DEVICE), qweight, scale)


def test_fp16_sums_past_fp16_range_before_scaling():
    # x @ qweight.T alone is ~127 * 40 * 1024, far beyond fp16's 65504; the outputs are ~4.
    qweight, scale = ref.quantize_per_channel(torch.full((4, 1024), 1e-4))
    x = torch.full((2, 1024), 40.0, dtype=torch.float16, device=DEVICE)
    out = tri.int8_linear(x, qweight.to(DEVICE), scale.to(DEVICE))
    assert torch.isfinite(out).all()
    assert_close(out, ref.int8_linear_ref(x, qweight.to(DEVICE), scale.to(DEVICE)))
