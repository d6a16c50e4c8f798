"""kernels/cpu/linear.py (oneDNN, prepacked fp32 weights) against the reference kernels/linear.py."""
import pytest
import torch

from tests.kernels.cpu_support import assert_matmul_close

from kernels import linear as ref
from kernels.cpu import linear as cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="this torch has no oneDNN (mkldnn) linear")


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tokens", [0, 1, 7, 64, 300])
@pytest.mark.parametrize("n,k", [(1, 16), (13, 100), (512, 256), (3072, 512)])
def test_packed_matches_f_linear(tokens, n, k):
    weight, bias, x = _randn(n, k), _randn(n, seed=1), _randn(tokens, k, seed=2)
    packed = cpu.pack(weight)
    assert packed.is_mkldnn, "an fp32 CPU weight is packed"
    assert_matmul_close(cpu.linear(x, packed, bias), x, weight, bias)
    assert_matmul_close(cpu.linear(x, packed), x, weight)


def test_leading_dims_and_a_strided_x():
    weight = _randn(24, 64)
    packed = cpu.pack(weight)
    x = _randn(6, 96)[:, :64]
    assert not x.is_contiguous()
    assert_matmul_close(cpu.linear(x, packed), x, weight)
    x3 = _randn(2, 3, 64)
    assert cpu.linear(x3, packed).shape == (2, 3, 24)


def test_the_loaded_weight_can_be_read_back():
    weight = _randn(40, 72)
    assert torch.equal(cpu.pack(weight).to_dense(), weight)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_dtypes_are_left_as_they_are(dtype):
    weight = _randn(8, 16).to(dtype)
    assert cpu.pack(weight) is weight
    x = _randn(3, 16).to(dtype)
    assert cpu.linear(x, weight).equal(ref.linear(x, weight))
