"""kernels/cpu/lora.py (C) against kernels/lora.py: rows of several adapters and of the
base in one batch, one row alone, zero-padded ranks, a strided x; a slot past the
adapter slots is refused."""
from __future__ import annotations

import pytest
import torch

from kernels import lora as ref
from kernels.cpu import lora as cpu
from tests.kernels.cpu_support import ATOL, RTOL, threads


def _stacks(num_slots: int, r: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # scaled so that every sum is of order 1, as the fp32 tolerances assume
    a = torch.randn(num_slots, r, k, generator=g) / k ** 0.5
    b = torch.randn(num_slots, r, n, generator=g) / r ** 0.5
    a[1, r // 2:] = 0          # slot 1: an adapter of half the rank, zero-padded
    b[1, r // 2:] = 0
    return a, b


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("rows, r, k, n", [(1, 16, 64, 96), (1, 48, 576, 1728), (7, 8, 64, 32), (33, 32, 96, 256)])
def test_matches_the_reference(rows, r, k, n, num_threads):
    a, b = _stacks(4, r, k, n)
    x = torch.randn(rows, k)
    slots = torch.tensor([(-1, 0, 1, 3, 2)[i % 5] for i in range(rows)])
    if rows == 1:
        slots = torch.tensor([1])
    with threads(num_threads):
        out = cpu.lora_delta(x, a, b, slots)
    torch.testing.assert_close(out, ref.lora_delta(x, a, b, slots), rtol=RTOL, atol=ATOL)
    assert not out[slots < 0].any()


def test_a_strided_x_and_a_base_only_row():
    a, b = _stacks(2, 8, 64, 40)
    wide = torch.randn(3, 100)
    x = wide[:, 10:74]
    slots = torch.tensor([0, -1, 1])
    torch.testing.assert_close(cpu.lora_delta(x, a, b, slots), ref.lora_delta(x, a, b, slots), rtol=RTOL, atol=ATOL)
    assert torch.equal(cpu.lora_delta(x[1:2], a, b, slots[1:2]), torch.zeros(1, 40))


def test_a_slot_past_the_slots_is_refused():
    a, b = _stacks(2, 8, 64, 40)
    with pytest.raises(ValueError, match="slot outside"):
        cpu.lora_delta(torch.randn(2, 64), a, b, torch.tensor([0, 2]))


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 9])
def test_a_fused_projection_takes_each_part_from_its_own_rows(rows, num_threads):
    """q, k, v of 40, 24, 24 columns under rank 8 each: b block-diagonal, as weights.py builds it;
    the parts' boundaries fall inside a block of 64 columns."""
    splits, r = (40, 24, 24), 8
    a, b = _stacks(3, 3 * r, 64, sum(splits))
    for p, (start, size) in enumerate(zip((0, 40, 64), splits)):
        mask = torch.ones(3 * r, dtype=torch.bool)
        mask[p * r:(p + 1) * r] = False
        b[:, mask, start:start + size] = 0
    x, slots = torch.randn(rows, 64), torch.tensor([i % 4 - 1 for i in range(rows)])
    with threads(num_threads):
        out = cpu.lora_delta(x, a, b, slots, splits)
    torch.testing.assert_close(out, ref.lora_delta(x, a, b, slots), rtol=RTOL, atol=ATOL)


def test_a_prefill_of_many_rows_matches_the_reference():
    """Past MANY_ROWS the reference's matmuls run: the same contract, base rows zero."""
    a, b = _stacks(4, 16, 64, 96)
    rows = cpu.MANY_ROWS + 3
    x = torch.randn(rows, 64)
    slots = torch.tensor([(-1, 0, 1, 3, 2)[i % 5] for i in range(rows)])
    out = cpu.lora_delta(x, a, b, slots, (48, 48))
    torch.testing.assert_close(out, ref.lora_delta(x, a, b, slots), rtol=RTOL, atol=ATOL)
    assert not out[slots < 0].any()
