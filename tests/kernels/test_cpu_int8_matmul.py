"""kernels/cpu/int8_matmul.py (C, fp32 activations) against the definition kernels/int8.py:int8_linear_ref."""
import pytest
import torch

from tests.kernels.cpu_support import assert_matmul_close, threads

from kernels import int8
from kernels.cpu import int8_matmul as cpu


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * torch.logspace(-3, 0, n)[:, None]


def _x(tokens, k, seed=1):
    return torch.randn(tokens, k, generator=torch.Generator().manual_seed(seed))


# 1 row takes 1 x 8 tiles, more rows 4 x 4 tiles; N and K off those sizes leave partial
# tiles and a masked tail of K. Exact up to the order of fp32 sums: no bf16 anywhere.
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 5, 17, 64, 256])
@pytest.mark.parametrize("n,k", [(1, 16), (3, 100), (13, 64), (48, 256), (37, 688)])
def test_matches_the_definition_in_fp32(tokens, n, k):
    qweight, scale = int8.quantize_per_channel(_weight(n, k))
    x, bias = _x(tokens, k), torch.randn(n)
    with threads(2):
        out = cpu.int8_linear(x, qweight, scale, bias)
    assert out.dtype == torch.float32 and out.shape == (tokens, n)
    assert_matmul_close(out, x, int8.dequantize(qweight, scale), bias)


def test_leading_dims_and_a_row_strided_view():
    qweight, scale = int8.quantize_per_channel(_weight(24, 64))
    wide = _x(6, 96)
    x = wide[:, :64]
    assert not x.is_contiguous()
    assert_matmul_close(cpu.int8_linear(x, qweight, scale), x, int8.dequantize(qweight, scale))
    x3 = _x(6, 64).view(2, 3, 64)
    assert cpu.int8_linear(x3, qweight, scale).shape == (2, 3, 24)


def test_more_rows_than_the_kernel_takes_go_to_the_matmul():
    qweight, scale = int8.quantize_per_channel(_weight(16, 64))
    x = _x(cpu.MAX_ROWS + 1, 64)
    torch.testing.assert_close(cpu.int8_linear(x, qweight, scale), int8.int8_linear(x, qweight, scale),
                               rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations_go_to_the_torch_path(dtype):
    qweight, scale = int8.quantize_per_channel(_weight(16, 64))
    x = _x(3, 64).to(dtype)
    assert cpu.int8_linear(x, qweight, scale).equal(int8.int8_linear(x, qweight, scale))
