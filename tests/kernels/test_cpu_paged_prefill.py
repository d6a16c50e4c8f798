"""kernels/cpu/paged_attention.py's prefill (C, flash-style, reading the paged cache in place)
against kernels/attention.py."""
import pytest
import torch

from tests.kernels.cpu_support import ATOL, RTOL, threads
from tests.kernels.paged_cases import drop_outside_window, paged_case

from kernels import attention as ref
from kernels.cpu import paged_attention as cpu


def prefill_case(context_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, seed=0):
    """Poisoned paged caches holding every context (cached prefix + this chunk), and the
    chunks' queries: sequence s's query_lens[s] rows are the last of its context."""
    _, k_cache, v_cache, tables, _, scale = paged_case(context_lens, num_kv_heads, num_kv_heads,
                                                       head_dim, block_size, seed=seed)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    return q, k_cache, v_cache, tables, list(query_lens), list(context_lens), scale


def _check(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale, **opts):
    out = cpu.paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale, **opts)
    assert out.abs().max() < 100, "read a poisoned slot beyond a context or before a window"
    expected = ref.paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale, **opts)
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)


# Whole prompts and chunks after a cached prefix, of lengths around the 16-token query
# tiles and 32-key tiles, one token included.
CONTEXTS = [40, 7, 100, 33, 1, 70]
QUERIES = [40, 3, 30, 33, 1, 17]


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 4, 1, 6])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (4, 1), (9, 3)])   # MHA, GQA 4:1, MQA, SmolLM2
def test_chunks_blocks_and_gqa(heads, kv_heads, block_size, num_threads):
    with threads(num_threads):
        _check(*prefill_case(CONTEXTS, QUERIES, heads, kv_heads, 64, block_size))


@pytest.mark.parametrize("head_dim", [32, 128, 48, 80, 8])
def test_head_dims(head_dim):
    with threads(2):
        _check(*prefill_case(CONTEXTS, QUERIES, 4, 2, head_dim, 16))


def test_long_prompts_with_large_logits_stay_stable():
    # many key tiles whose running max jumps: the rescaled sums must not overflow
    q, k_cache, v_cache, tables, q_lens, ctx_lens, _ = prefill_case([300, 129, 64], [300, 50, 64], 4, 2, 64, 16)
    _check(q * 30, k_cache, v_cache, tables, q_lens, ctx_lens, 1.0)


# Blocks wholly before the first query's window are poisoned, as the block manager frees them.
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("window,softcap", [(5, None), (16, None), (1, None), (None, 2.0), (7, 2.0), (40, 30.0)])
def test_sliding_window_and_softcap(window, softcap, num_threads):
    q, k_cache, v_cache, tables, q_lens, ctx_lens, scale = prefill_case(CONTEXTS, QUERIES, 4, 2, 64, 4)
    if window is not None:
        first_query_lens = torch.tensor([c - n + 1 for c, n in zip(ctx_lens, q_lens)])
        tables = drop_outside_window(tables, first_query_lens, window, 4)
    with threads(num_threads):
        _check(q * 3, k_cache, v_cache, tables, q_lens, ctx_lens, scale, window=window, softcap=softcap)


@pytest.mark.parametrize("window,softcap", [(None, None), (6, None), (None, 5.0)])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (3, 1)])
def test_nothing_cached_reads_k_and_v_directly(heads, kv_heads, window, softcap):
    lens = [17, 1, 40, 5]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens), heads, 32, generator=g)
    kv = torch.randn(sum(lens), 2 * kv_heads, 32, generator=g)
    k, v = kv.split(kv_heads, dim=1)             # strided views, as split from a fused qkv
    out = cpu.prefill_attention(q, k, v, lens, 0.2, window, softcap)
    torch.testing.assert_close(out, ref.prefill_attention(q, k, v, lens, 0.2, window, softcap),
                               rtol=RTOL, atol=ATOL)


def test_q_as_a_strided_view_of_qkv():
    q, *rest = prefill_case([20, 9], [12, 9], 4, 2, 32, 16)
    qkv = torch.zeros(q.shape[0], 8, 32)
    qkv[:, :4] = q
    assert not qkv[:, :4].is_contiguous()
    _check(qkv[:, :4], *rest)


def test_int64_tables_are_taken():
    q, k_cache, v_cache, tables, *rest = prefill_case([20, 9], [12, 9], 4, 2, 64, 16)
    _check(q, k_cache, v_cache, tables.long(), *rest)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_goes_to_the_reference(dtype):
    q, k_cache, v_cache, tables, *rest = prefill_case([20, 9], [12, 9], 4, 2, 64, 16)
    args = (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), tables, *rest)
    torch.testing.assert_close(cpu.paged_prefill_attention(*args), ref.paged_prefill_attention(*args),
                               rtol=0, atol=0)


@pytest.mark.parametrize("q_lens,ctx_lens", [([12, 10], [20, 9]),     # a query longer than its context
                                             ([12, 0], [20, 0]),      # an empty sequence
                                             ([12, 9], [20, 3 * 16 + 1]),   # past the 3-block table
                                             ([12, 8], [20, 9])])     # rows not summing to q's
def test_lengths_outside_the_tables_are_refused(q_lens, ctx_lens):
    q, k_cache, v_cache, tables, _, _, scale = prefill_case([20, 9], [12, 9], 4, 2, 64, 16)
    with pytest.raises(ValueError, match="query_len"):
        cpu.paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale)


@pytest.mark.parametrize("opts", [dict(window=0), dict(softcap=0.0)])
def test_a_window_or_softcap_below_one_is_refused(opts):
    with pytest.raises(ValueError, match="window"):
        cpu.paged_prefill_attention(*prefill_case([5], [5], 2, 1, 16, 4), **opts)
