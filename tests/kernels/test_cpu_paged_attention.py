"""kernels/cpu/paged_attention.py (C, reading the paged cache in place) against kernels/attention.py."""
import pytest
import torch

from tests.kernels.cpu_support import ATOL, RTOL, threads
from tests.kernels.paged_cases import drop_outside_window, paged_case

from kernels import attention as ref
from kernels.cpu import paged_attention as cpu


def _check(q, k_cache, v_cache, tables, lens, scale, **opts):
    out = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, **opts)
    assert out.abs().max() < 100, "read a poisoned slot beyond a context"
    torch.testing.assert_close(out, ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, **opts),
                               rtol=RTOL, atol=ATOL)


# With 2 threads, a batch of 4 or more is split by sequence (all kv heads of one at a
# time), a smaller one by (sequence, kv head): both ways are checked.
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (4, 1), (8, 2)])
def test_block_boundaries_and_gqa(heads, kv_heads, block_size, num_threads):
    bs = block_size
    lens = [1, bs, bs + 1, 2 * bs, 2 * bs + 3]       # 1 token; k blocks; k blocks + 1; partial
    with threads(num_threads):
        _check(*paged_case(lens, heads, kv_heads, 64, block_size))
        _check(*paged_case(lens[-2:], heads, kv_heads, 64, block_size))


# 32, 64 and 128 take the vectorized loops; the others the plain ones.
@pytest.mark.parametrize("head_dim", [32, 64, 128, 16, 48, 80])
def test_head_dims(head_dim):
    with threads(2):
        _check(*paged_case([5, 17, 33, 2, 40], 4, 2, head_dim, 16))
        _check(*paged_case([5, 17], 4, 2, head_dim, 16))


@pytest.mark.parametrize("block_size", [6, 1])
def test_odd_block_sizes(block_size):
    _check(*paged_case([1, block_size, 2 * block_size + 1, 7], 2, 1, 32, block_size))


def test_single_sequence_single_token():
    _check(*paged_case([1], 2, 1, 64, 16))


def test_long_context_softmax_is_stable():
    # Large logits over many blocks: max-subtracted exponentials, no overflow.
    q, k_cache, v_cache, tables, lens, _ = paged_case([300, 3, 129, 64], 4, 2, 64, 16)
    _check(q * 30, k_cache, v_cache, tables, lens, 1.0)


def test_q_as_a_strided_view_of_qkv():
    q, k_cache, v_cache, tables, lens, scale = paged_case([7, 20], 4, 2, 32, 16)
    qkv = torch.zeros(2, 8, 32)
    qkv[:, :4] = q
    view = qkv[:, :4]
    assert not view.is_contiguous()
    _check(view, k_cache, v_cache, tables, lens, scale)


def test_int64_tables_and_lengths_are_taken():
    q, k_cache, v_cache, tables, lens, scale = paged_case([9, 30], 4, 2, 64, 16)
    _check(q, k_cache, v_cache, tables.long(), lens.long(), scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_goes_to_the_reference(dtype):
    args = paged_case([1, 16, 23], 8, 2, 64, 16, dtype=dtype)
    torch.testing.assert_close(cpu.paged_decode_attention(*args), ref.paged_decode_attention(*args),
                               rtol=0, atol=0)


@pytest.mark.parametrize("bad_len", [0, 3 * 16 + 1])
def test_a_context_outside_its_block_table_is_refused(bad_len):
    q, k_cache, v_cache, tables, lens, scale = paged_case([5, 20], 4, 2, 64, 16)
    lens[1] = bad_len                       # the table is 3 blocks wide
    with pytest.raises(ValueError, match="context_lens"):
        cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)


# Blocks wholly before a window are poisoned: reading one shows at once.
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("window,softcap", [(5, None), (16, None), (1, None), (None, 2.0), (7, 2.0)])
@pytest.mark.parametrize("head_dim", [64, 48])
def test_sliding_window_and_softcap(window, softcap, head_dim, num_threads):
    q, k_cache, v_cache, tables, lens, scale = paged_case([1, 4, 17, 33, 40], 4, 2, head_dim, 4)
    if window is not None:
        tables = drop_outside_window(tables, lens, window, 4)
    with threads(num_threads):
        _check(q * 3, k_cache, v_cache, tables, lens, scale, window=window, softcap=softcap)


@pytest.mark.parametrize("opts", [dict(window=0), dict(softcap=0.0)])
def test_a_window_or_softcap_below_one_is_refused(opts):
    with pytest.raises(ValueError, match="window"):
        cpu.paged_decode_attention(*paged_case([5], 2, 1, 16, 4), **opts)


# ---- write_kv

def _qkv_views(tokens: int, kv_heads: int, dim: int):
    """k as the rotary leaves it (contiguous), v as a view of the fused qkv rows."""
    qkv = torch.randn(tokens, (4 + 2) * kv_heads * dim)
    k = torch.randn(tokens, kv_heads, dim)
    v = qkv[:, -kv_heads * dim:].view(tokens, kv_heads, dim)
    return k, v


def test_write_kv_matches_the_reference_with_v_a_view_of_qkv():
    k, v = _qkv_views(5, 2, 16)
    slots = torch.tensor([3, 17, 0, 31, 8])
    ours = [torch.randn(4, 8, 2, 16) for _ in range(2)]
    theirs = [c.clone() for c in ours]
    cpu.write_kv(k, v, *ours, slots)
    ref.write_kv(k, v, *theirs, slots)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert torch.equal(ours[0].view(-1, 2, 16)[17], k[1]) and torch.equal(ours[1].view(-1, 2, 16)[31], v[3])


@pytest.mark.parametrize("bad", [-1, 32])
def test_write_kv_refuses_a_slot_outside_the_cache_and_writes_nothing(bad):
    k, v = _qkv_views(2, 2, 16)
    caches = [torch.zeros(4, 8, 2, 16) for _ in range(2)]
    with pytest.raises(ValueError, match="slot outside the cache"):
        cpu.write_kv(k, v, *caches, torch.tensor([1, bad]))
    assert not any(c.any() for c in caches)


def test_write_kv_into_a_bf16_cache_rounds_as_the_reference():
    k, v = _qkv_views(3, 2, 16)
    slots = torch.tensor([2, 5, 9])
    ours = [torch.zeros(4, 8, 2, 16, dtype=torch.bfloat16) for _ in range(2)]
    theirs = [c.clone() for c in ours]
    cpu.write_kv(k, v, *ours, slots)
    ref.write_kv(k, v, *theirs, slots)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
