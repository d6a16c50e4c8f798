"""kernels/triton/paged_attention.py against kernels/attention.py (interpreter on the CPU)."""
import functools

import pytest
import torch

from tests.kernels.paged_cases import drop_outside_window, paged_case
from tests.kernels.triton_support import DEVICE, assert_close

from kernels import attention as ref
from kernels.triton import paged_attention as tri

_case = functools.partial(paged_case, device=DEVICE)


def _check(*args, rounded_to=None, **opts):
    out = tri.paged_decode_attention(*args, **opts)
    expected = ref.paged_decode_attention(*args, **opts)
    assert out.abs().max() < 100, "read a poisoned slot beyond a context"
    assert_close(out, expected, rounded_to)


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (4, 1)])
def test_block_boundaries_and_gqa(heads, kv_heads, block_size):
    # 1 token; exactly k blocks; k blocks + 1; a partial block further on.
    bs = block_size
    lens = [1, bs, bs + 1, 2 * bs, 2 * bs + 3]
    _check(*_case(lens, heads, kv_heads, 32, block_size))


@pytest.mark.parametrize("head_dim", [16, 64, 48, 80])
def test_head_dims(head_dim):
    # 48 and 80 are not powers of two: padded to 64 and 128 and masked.
    _check(*_case([5, 17, 33], 2, 1, head_dim, 16))


@pytest.mark.parametrize("block_size", [6, 1])
def test_odd_block_sizes(block_size):
    _check(*_case([1, block_size, 2 * block_size + 1, 7], 2, 1, 32, block_size))


def test_single_sequence_single_token():
    _check(*_case([1], 2, 1, 16, 16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    _check(*_case([1, 16, 23], 8, 2, 64, 16, dtype=dtype))


def test_q_as_a_strided_view_of_qkv():
    q, k_cache, v_cache, tables, lens, scale = _case([7, 20], 4, 2, 32, 16)
    batch, heads, dim = q.shape
    qkv = torch.zeros(batch, heads + 4, dim, device=DEVICE)
    qkv[:, :heads] = q
    view = qkv[:, :heads]
    assert not view.is_contiguous()
    torch.testing.assert_close(tri.paged_decode_attention(view, k_cache, v_cache, tables, lens, scale),
                               ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale),
                               rtol=2e-5, atol=2e-5)


def test_long_context_softmax_is_stable():
    # Large logits across many blocks: the online softmax must rescale, not overflow.
    q, k_cache, v_cache, tables, lens, _ = _case([70, 3], 2, 1, 16, 16)
    _check(q * 30, k_cache, v_cache, tables, lens, 1.0)


def test_heads_not_a_multiple_of_kv_heads_is_refused():
    q, k_cache, v_cache, tables, lens, scale = _case([3], 3, 2, 16, 16)
    with pytest.raises(ValueError, match="multiple"):
        tri.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)


# Blocks wholly before a window are poisoned: reading one shows at once.
@pytest.mark.parametrize("window,softcap", [(5, None), (16, None), (1, None), (None, 2.0), (7, 2.0)])
def test_sliding_window_and_softcap(window, softcap):
    q, k_cache, v_cache, tables, lens, scale = _case([1, 4, 17, 33, 40], 4, 2, 16, 4)
    if window is not None:
        tables = drop_outside_window(tables, lens, window, 4)
    _check(q * 3, k_cache, v_cache, tables, lens, scale, window=window, softcap=softcap)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sliding_window_and_softcap_in_half_precision(dtype):
    q, k_cache, v_cache, tables, lens, scale = _case([3, 17, 23], 8, 2, 64, 16, dtype=dtype)
    _check(q, k_cache, v_cache, drop_outside_window(tables, lens, 6, 16), lens, scale, window=6, softcap=3.0)
