"""kernels/cpu/invariant_linear.c: x @ w.T + bias, each row's result the same bits
whatever rows come with it, wherever it sits among them, and at any thread count."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu.build import NativeUnavailable

try:
    from kernels.cpu import invariant_linear
except NativeUnavailable as exc:    # no C compiler: there is no batch-invariant mode either
    pytest.skip(f"CPU C kernels unavailable: {exc}", allow_module_level=True)

# shapes with every tail: K not a multiple of 8, N not of 4 nor of the 64-channel panel,
# rows past one 48-row block
SHAPES = [(100, 64, 128), (131, 77, 203), (97, 576, 1536), (5, 9, 3)]


@pytest.mark.parametrize("rows,k,n", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_each_row_is_the_same_bits_in_any_batch(rows, k, n, with_bias):
    g = torch.Generator().manual_seed(rows * k + n)
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(n, k, generator=g)
    bias = torch.randn(n, generator=g) if with_bias else None
    full = invariant_linear.linear(x, w, bias)
    exact = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
    torch.testing.assert_close(full, exact.float(), rtol=1e-5, atol=1e-4 * k ** 0.5)
    for start, count in [(0, 1), (rows - 1, 1), (1, 2), (2, 3), (3, min(rows - 3, 50)), (0, rows // 2)]:
        if count < 1 or start + count > rows:
            continue
        alone = invariant_linear.linear(x[start:start + count], w, bias)
        assert torch.equal(alone, full[start:start + count]), (start, count)
    shuffled = torch.randperm(rows, generator=g)
    assert torch.equal(invariant_linear.linear(x[shuffled], w, bias), full[shuffled])


def test_thread_count_changes_no_bit():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 300, generator=g), torch.randn(500, 300, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = invariant_linear.linear(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, invariant_linear.linear(x, w))


def test_strided_rows_and_leading_dims():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 40, generator=g)[:, :, :33]          # row stride 40, not 33
    w = torch.randn(20, 33, generator=g)
    out = invariant_linear.linear(x, w)
    assert out.shape == (2, 6, 20)
    assert torch.equal(out, invariant_linear.linear(x.contiguous(), w))


def test_refuses_what_it_cannot_sum_in_order():
    with pytest.raises(TypeError, match="fp32"):
        invariant_linear.linear(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16))
