"""kernels/triton/rmsnorm.py against kernels/rmsnorm.py (interpreter on the CPU)."""
import pytest
import torch

from tests.kernels.triton_support import DEVICE, assert_close

from kernels import rmsnorm as ref
from kernels.triton import rmsnorm as tri

EPS = 1e-6
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(tokens, hidden, dtype, weight_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    residual = torch.randn(tokens, hidden, generator=g).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(weight_dtype or dtype)
    return x.to(DEVICE), residual.to(DEVICE), weight.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 16), (3, 48), (5, 100), (17, 256)])
def test_rms_norm(tokens, hidden, dtype):
    x, _, weight = _inputs(tokens, hidden, dtype)
    assert_close(tri.rms_norm(x, weight, EPS), ref.rms_norm(x, weight, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 16), (4, 80), (9, 128)])
def test_fused_add_rms_norm(tokens, hidden, dtype):
    x, residual, weight = _inputs(tokens, hidden, dtype)
    normed, residual_out = tri.fused_add_rms_norm(x, residual, weight, EPS)
    normed_ref, residual_ref = ref.fused_add_rms_norm(x, residual, weight, EPS)
    assert_close(residual_out, residual_ref)
    assert_close(normed, normed_ref)


def test_fp32_weight_promotes_like_torch():
    # A bf16 activation with an fp32 norm weight gives fp32 out in the reference.
    x, residual, weight = _inputs(3, 64, torch.bfloat16, weight_dtype=torch.float32)
    assert_close(tri.rms_norm(x, weight, EPS), ref.rms_norm(x, weight, EPS), torch.bfloat16)
    # bf16 + fp32 residual: the sum and everything after it are fp32.
    normed, residual_out = tri.fused_add_rms_norm(x, residual.float(), weight, EPS)
    normed_ref, residual_ref = ref.fused_add_rms_norm(x, residual.float(), weight, EPS)
    assert residual_out.dtype == torch.float32
    assert_close(residual_out, residual_ref)
    assert_close(normed, normed_ref)


def test_leading_dims_and_row_strides():
    # [B, S, H] input, and rows that are a slice of a wider buffer (row stride > H).
    x, _, weight = _inputs(6, 96, torch.float32)
    x3 = x.view(2, 3, 96)
    assert_close(tri.rms_norm(x3, weight, EPS), ref.rms_norm(x3, weight, EPS))
    wide = torch.randn(5, 160, device=DEVICE)[:, 32:128]
    assert wide.stride(0) == 160
    assert_close(tri.rms_norm(wide, weight, EPS), ref.rms_norm(wide, weight, EPS))


def test_large_offset_is_normalized_not_clipped():
    # Rows with a large common value: the fp32 mean of squares must not lose it.
    x, _, weight = _inputs(2, 64, torch.float32)
    x = x + 1000.0
    assert_close(tri.rms_norm(x, weight, EPS), ref.rms_norm(x, weight, EPS))


def test_empty_batch():
    x, _, weight = _inputs(1, 32, torch.float32)
    assert tri.rms_norm(x[:0], weight, EPS).shape == (0, 32)
