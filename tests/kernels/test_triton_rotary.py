"""kernels/triton/rotary.py against kernels/rotary.py (interpreter on the CPU)."""
import pytest
import torch

from tests.kernels.triton_support import DEVICE, assert_close

from kernels import rotary as ref
from kernels.triton import rotary as tri


def _cos_sin(tokens, head_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Positions far apart, not 0..T-1, so rows do not share angles.
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos, sin = ref.rotary_cos_sin(positions, inv_freq)
    return cos.to(DEVICE), sin.to(DEVICE)


@pytest.mark.parametrize("head_dim", [16, 32, 64, 48, 80, 128])
@pytest.mark.parametrize("tokens,heads", [(1, 1), (5, 3)])
def test_apply_rotary_fp32(tokens, heads, head_dim):
    x = torch.randn(tokens, heads, head_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    cos, sin = _cos_sin(tokens, head_dim)
    assert_close(tri.apply_rotary(x, cos, sin), ref.apply_rotary(x, cos, sin))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_apply_rotary_half(head_dim, dtype):
    x = torch.randn(4, 2, head_dim, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    cos, sin = _cos_sin(4, head_dim)
    # The reference rounds after each of its three ops; the kernel rounds once.
    assert_close(tri.apply_rotary(x, cos, sin), ref.apply_rotary(x, cos, sin))


def test_strided_heads_from_a_fused_qkv():
    # q and k as views into one [T, (nh + 2*nkv) * D] projection, as a model produces them.
    tokens, nh, nkv, dim = 3, 4, 2, 32
    qkv = torch.randn(tokens, (nh + 2 * nkv) * dim, device=DEVICE)
    q = qkv[:, :nh * dim].view(tokens, nh, dim)
    k = qkv[:, nh * dim:(nh + nkv) * dim].view(tokens, nkv, dim)
    cos, sin = _cos_sin(tokens, dim)
    assert not q.is_contiguous()
    assert_close(tri.apply_rotary(q, cos, sin), ref.apply_rotary(q, cos, sin))
    assert_close(tri.apply_rotary(k, cos, sin), ref.apply_rotary(k, cos, sin))


def test_position_zero_is_identity():
    x = torch.randn(2, 3, 48, device=DEVICE)
    cos, sin = ref.rotary_cos_sin(torch.zeros(2, dtype=torch.long), torch.rand(24))
    torch.testing.assert_close(tri.apply_rotary(x, cos.to(DEVICE), sin.to(DEVICE)), x, rtol=0, atol=0)


def test_odd_head_dim_is_refused():
    x = torch.randn(2, 1, 15, device=DEVICE)
    cos = sin = torch.zeros(2, 7, device=DEVICE)
    with pytest.raises(ValueError, match="even"):
        tri.apply_rotary(x, cos, sin)
