"""kernels/cpu/{rmsnorm,rotary,activation}.py (C) against their references in kernels/."""
import pytest
import torch

from tests.kernels.cpu_support import ATOL, RTOL, threads

from kernels import activation, rmsnorm, rotary
from kernels.cpu import activation as cpu_activation
from kernels.cpu import rmsnorm as cpu_rmsnorm
from kernels.cpu import rotary as cpu_rotary

EPS = 1e-6


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


# 300 x 512 rows are enough to be split over threads; the others run on one
@pytest.mark.parametrize("tokens,hidden", [(1, 16), (3, 48), (5, 100), (300, 512)])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_rms_norm(tokens, hidden, num_threads):
    x, weight = _randn(tokens, hidden), _randn(hidden, seed=1) + 2
    with threads(num_threads):
        _close(cpu_rmsnorm.rms_norm(x, weight, EPS), rmsnorm.rms_norm(x, weight, EPS))


@pytest.mark.parametrize("tokens,hidden", [(1, 16), (4, 80), (300, 512)])
def test_fused_add_rms_norm(tokens, hidden):
    x, residual, weight = _randn(tokens, hidden), _randn(tokens, hidden, seed=1), _randn(hidden, seed=2)
    normed, residual_out = cpu_rmsnorm.fused_add_rms_norm(x, residual, weight, EPS)
    normed_ref, residual_ref = rmsnorm.fused_add_rms_norm(x, residual, weight, EPS)
    _close(residual_out, residual_ref)
    _close(normed, normed_ref)
    assert residual.equal(_randn(tokens, hidden, seed=1)), "the residual input was written to"


def test_rms_norm_of_a_row_strided_view():
    wide = _randn(6, 96)
    x, weight = wide[:, :64], _randn(64, seed=1)
    assert not x.is_contiguous()
    _close(cpu_rmsnorm.rms_norm(x, weight, EPS), rmsnorm.rms_norm(x, weight, EPS))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_half_goes_to_the_reference(dtype):
    x, weight = _randn(3, 64).to(dtype), _randn(64, seed=1).to(dtype)
    assert cpu_rmsnorm.rms_norm(x, weight, EPS).equal(rmsnorm.rms_norm(x, weight, EPS))


def _cos_sin(tokens, head_dim):
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(3))
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return rotary.rotary_cos_sin(positions, inv_freq)


@pytest.mark.parametrize("head_dim", [16, 48, 64, 128])
@pytest.mark.parametrize("tokens,heads", [(1, 1), (5, 3), (200, 8)])
def test_apply_rotary(tokens, heads, head_dim):
    x = _randn(tokens, heads, head_dim)
    cos, sin = _cos_sin(tokens, head_dim)
    _close(cpu_rotary.apply_rotary(x, cos, sin), rotary.apply_rotary(x, cos, sin))


def test_rotary_reads_q_and_k_where_they_lie_in_qkv():
    tokens, nh, nkv, dim = 3, 4, 2, 32
    qkv = _randn(tokens, (nh + 2 * nkv) * dim)
    q = qkv[:, :nh * dim].view(tokens, nh, dim)
    k = qkv[:, nh * dim:(nh + nkv) * dim].view(tokens, nkv, dim)
    cos, sin = _cos_sin(tokens, dim)
    assert not q.is_contiguous()
    _close(cpu_rotary.apply_rotary(q, cos, sin), rotary.apply_rotary(q, cos, sin))
    _close(cpu_rotary.apply_rotary(k, cos, sin), rotary.apply_rotary(k, cos, sin))


@pytest.mark.parametrize("tokens,width", [(1, 8), (7, 100), (64, 1536)])
def test_silu_and_mul(tokens, width):
    x = _randn(tokens, 2 * width) * 4        # well into both tails of silu
    _close(cpu_activation.silu_and_mul(x), activation.silu_and_mul(x))


def test_silu_and_mul_reference_is_swiglu():
    x = torch.tensor([[0.0, 1.0, -2.0, 3.0, 5.0, 7.0]])
    gate, up = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([3.0, 5.0, 7.0])
    expected = gate / (1 + torch.exp(-gate)) * up
    torch.testing.assert_close(activation.silu_and_mul(x), expected[None])


def test_a_weight_of_another_dtype_goes_to_the_reference():
    # fp32 rows with a bf16 norm weight: the reference promotes, the C kernel reads fp32 only
    x, weight = _randn(3, 64), (_randn(64, seed=1) + 2).to(torch.bfloat16)
    assert cpu_rmsnorm.rms_norm(x, weight, EPS).equal(rmsnorm.rms_norm(x, weight, EPS))


def test_more_leading_dims_go_to_the_reference():
    x, weight = _randn(2, 3, 64), _randn(64, seed=1)
    assert cpu_rmsnorm.rms_norm(x, weight, EPS).equal(rmsnorm.rms_norm(x, weight, EPS))
    g = _randn(2, 3, 16)
    assert cpu_activation.silu_and_mul(g).equal(activation.silu_and_mul(g))
