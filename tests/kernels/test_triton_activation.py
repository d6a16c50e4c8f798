"""kernels/triton/activation.py against kernels/activation.py (interpreter on the CPU)."""
import pytest
import torch

from tests.kernels.triton_support import DEVICE, assert_close

from kernels import activation as ref
from kernels.triton import activation as tri


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens,width", [(1, 8), (3, 100), (2, 1500)])
def test_silu_and_mul(tokens, width, dtype):
    # 1500 columns span two programs, the second one partly masked
    x = (torch.randn(tokens, 2 * width, generator=torch.Generator().manual_seed(0)) * 4).to(DEVICE, dtype)
    assert_close(tri.silu_and_mul(x), ref.silu_and_mul(x))


def test_no_rows():
    x = torch.randn(0, 16, device=DEVICE)
    assert tri.silu_and_mul(x).shape == (0, 8)
