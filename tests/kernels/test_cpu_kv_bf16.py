"""A bf16 KV cache under fp32 queries (kv_cache_dtype="bfloat16"): kernels/attention.py's
write_kv rounds into it and its references read it widened; kernels/cpu/paged_attention.py's
C kernels read its rows in place and must equal those references given the same bf16 cache."""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from tests.kernels.cpu_support import ATOL, RTOL, threads
from tests.kernels.paged_cases import drop_outside_window, paged_case

from kernels import attention as ref
from kernels.cpu import paged_attention as cpu

BF16 = torch.bfloat16


def bf16_case(context_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, seed: int = 0) -> tuple[Any, ...]:
    """paged_case (shuffled blocks, poisoned slots past every context) with bf16 caches."""
    q, k_cache, v_cache, tables, lens, scale = paged_case(  # type: ignore[no-untyped-call]
        context_lens, num_heads, num_kv_heads, head_dim, block_size, seed=seed)
    return q, k_cache.to(BF16), v_cache.to(BF16), tables, lens, scale


def check_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                 lens: torch.Tensor, scale: float, **opts: Any) -> None:
    out = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, **opts)
    assert out.dtype == torch.float32
    assert out.abs().max() < 100, "read a poisoned slot beyond a context"
    expected = ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, **opts)
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)


def prefill_case(context_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int, seed: int = 0) -> tuple[Any, ...]:
    """bf16 caches holding every context, and fp32 queries for the last query_lens[s] of each."""
    _, k_cache, v_cache, tables, _, scale = bf16_case(context_lens, num_kv_heads, num_kv_heads,
                                                      head_dim, block_size, seed)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    return q, k_cache, v_cache, tables, list(query_lens), list(context_lens), scale


def check_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                  q_lens: list[int], ctx_lens: list[int], scale: float, **opts: Any) -> None:
    out = cpu.paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale, **opts)
    assert out.abs().max() < 100, "read a poisoned slot beyond a context or before a window"
    expected = ref.paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale, **opts)
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)


# ---- the definition: write_kv rounds, the references widen

def test_write_kv_rounds_fp32_to_nearest_even_bf16() -> None:
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    k[0, 0, 0] = 1 + 2 ** -8            # a tie: rounds to even, 1.0
    k[0, 0, 1] = 1 + 3 * 2 ** -8        # a tie: rounds to even, 1 + 2 ** -6
    k_cache, v_cache = torch.zeros(4, 4, 2, 8, dtype=BF16), torch.zeros(4, 4, 2, 8, dtype=BF16)
    slots = torch.tensor([3, 9, 0, 15, 4])
    ref.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(-1, 2, 8)[slots], k.to(BF16))
    assert torch.equal(v_cache.view(-1, 2, 8)[slots], v.to(BF16))
    assert k_cache.view(-1, 2, 8)[3, 0, :2].tolist() == [1.0, 1 + 2 ** -6]


def test_references_read_a_bf16_cache_as_its_fp32_widening_exactly() -> None:
    q, k_cache, v_cache, tables, lens, scale = bf16_case([5, 17, 40], 4, 2, 32, 4)
    wide = k_cache.float(), v_cache.float()
    assert torch.equal(ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale),
                       ref.paged_decode_attention(q, *wide, tables, lens, scale))
    q2 = torch.randn(9, 4, 32)
    opts: dict[str, Any] = dict(block_tables=tables, query_lens=[3, 2, 4], context_lens=lens.tolist(),
                                scale=scale, window=6, softcap=5.0)
    assert torch.equal(ref.paged_prefill_attention(q2, k_cache, v_cache, **opts),
                       ref.paged_prefill_attention(q2, *wide, **opts))


def test_bf16_caches_under_fp32_queries_take_the_c_kernels() -> None:
    q, k_cache, v_cache, *_ = bf16_case([5], 4, 2, 32, 4)
    for kernels in (cpu.DECODE_KERNELS, cpu.PREFILL_KERNELS):
        assert cpu.c_kernel(kernels, q, k_cache, v_cache) is kernels[BF16]
        assert cpu.c_kernel(kernels, q, k_cache.float(), v_cache.float()) is kernels[torch.float32]
        assert kernels[BF16] is not kernels[torch.float32]
        # what has no C kernel goes to the reference
        assert cpu.c_kernel(kernels, q.to(BF16), k_cache, v_cache) is None
        assert cpu.c_kernel(kernels, q, k_cache.half(), v_cache.half()) is None
        assert cpu.c_kernel(kernels, q, k_cache, v_cache.float()) is None


# ---- decode

# With 2 threads, a batch of 4 or more is split by sequence, a smaller one by (sequence, kv head).
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 4, 1, 6])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (8, 2), (9, 3), (4, 1)])   # GQA, SmolLM2, MQA
def test_decode_blocks_and_gqa(heads: int, kv_heads: int, block_size: int, num_threads: int) -> None:
    bs = block_size
    lens = [1, bs, bs + 1, 2 * bs + 3, 37]
    with threads(num_threads):
        check_decode(*bf16_case(lens, heads, kv_heads, 64, block_size))
        check_decode(*bf16_case(lens[-2:], heads, kv_heads, 64, block_size))


# 32, 64 and 128 take the vectorized loops; the others the plain ones.
@pytest.mark.parametrize("head_dim", [32, 64, 128, 48, 16])
def test_decode_head_dims(head_dim: int) -> None:
    with threads(2):
        check_decode(*bf16_case([5, 17, 33, 2, 40], 4, 2, head_dim, 16))


@pytest.mark.parametrize("window,softcap", [(5, None), (16, None), (1, None), (None, 2.0), (7, 30.0)])
def test_decode_sliding_window_and_softcap(window: Optional[int], softcap: Optional[float]) -> None:
    q, k_cache, v_cache, tables, lens, scale = bf16_case([3, 17, 40, 64], 4, 2, 64, 4)
    if window is not None:
        tables = drop_outside_window(tables, lens, window, 4)  # type: ignore[no-untyped-call]
    with threads(2):
        check_decode(q * 3, k_cache, v_cache, tables, lens, scale, window=window, softcap=softcap)


def test_decode_long_context_with_large_logits_is_stable() -> None:
    q, k_cache, v_cache, tables, lens, _ = bf16_case([300, 3, 129], 4, 2, 64, 16)
    check_decode(q * 30, k_cache, v_cache, tables, lens, 1.0)


# ---- prefill

CONTEXTS = [40, 7, 100, 33, 1, 70]
QUERIES = [40, 3, 30, 33, 1, 17]


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 4, 1, 6])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (9, 3), (4, 1)])
def test_prefill_chunks_blocks_and_gqa(heads: int, kv_heads: int, block_size: int, num_threads: int) -> None:
    with threads(num_threads):
        check_prefill(*prefill_case(CONTEXTS, QUERIES, heads, kv_heads, 64, block_size))


# multiples of 32 go 32 columns at a time, then 8, then one
@pytest.mark.parametrize("head_dim", [32, 128, 48, 80, 8])
def test_prefill_head_dims(head_dim: int) -> None:
    with threads(2):
        check_prefill(*prefill_case(CONTEXTS, QUERIES, 4, 2, head_dim, 16))


@pytest.mark.parametrize("window,softcap", [(5, None), (16, None), (1, None), (None, 2.0), (7, 2.0), (40, 30.0)])
def test_prefill_sliding_window_and_softcap(window: Optional[int], softcap: Optional[float]) -> None:
    q, k_cache, v_cache, tables, q_lens, ctx_lens, scale = prefill_case(CONTEXTS, QUERIES, 4, 2, 64, 4)
    if window is not None:
        first_query_lens = torch.tensor([c - n + 1 for c, n in zip(ctx_lens, q_lens)])
        tables = drop_outside_window(tables, first_query_lens, window, 4)  # type: ignore[no-untyped-call]
    with threads(2):
        check_prefill(q * 3, k_cache, v_cache, tables, q_lens, ctx_lens, scale, window=window, softcap=softcap)


@pytest.mark.parametrize("window,softcap", [(None, None), (6, None), (None, 5.0)])
def test_nothing_cached_reads_bf16_k_and_v_directly(window: Optional[int], softcap: Optional[float]) -> None:
    lens = [17, 1, 40, 5]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens), 8, 32, generator=g)
    kv = torch.randn(sum(lens), 4, 32, generator=g).to(BF16)
    k, v = kv[:, :2], kv[:, 2:]           # strided views, as split from a fused qkv
    out = cpu.prefill_attention(q, k, v, lens, 0.2, window, softcap)
    torch.testing.assert_close(out, ref.prefill_attention(q, k, v, lens, 0.2, window, softcap),
                               rtol=RTOL, atol=ATOL)


def test_bf16_cache_is_close_to_the_fp32_one() -> None:
    # the rounding of k and v moves the output by about bf16's precision, no more
    q, k_cache, v_cache, tables, lens, scale = paged_case([40, 17, 300], 4, 2, 64, 16)  # type: ignore[no-untyped-call]
    full = cpu.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    half = cpu.paged_decode_attention(q, k_cache.to(BF16), v_cache.to(BF16), tables, lens, scale)
    assert not torch.equal(full, half)
    torch.testing.assert_close(half, full, rtol=0, atol=2 ** -7)
