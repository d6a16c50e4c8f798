"""kernels/triton/lora.py against kernels/lora.py (interpreter on the CPU): rows of several
adapters and of the base, ranks that are not powers of two, K and N ragged against the
blocks, half-precision activations."""
from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_support import DEVICE, assert_close

from kernels import lora as ref
from kernels.triton import lora as tri


def _case(rows: int, r: int, k: int, n: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(rows * 1000 + r)
    a = torch.randn(3, r, k, generator=g) / k ** 0.5
    b = torch.randn(3, r, n, generator=g) / r ** 0.5
    x = torch.randn(rows, k, generator=g).to(dtype)
    slots = torch.tensor([(i % 4) - 1 for i in range(rows)])
    return [t.to(DEVICE) for t in (x, a, b, slots)]


@pytest.mark.parametrize("rows, r, k, n", [(1, 16, 64, 96), (5, 24, 100, 200), (9, 48, 576, 130)])
def test_matches_the_reference(rows, r, k, n):
    x, a, b, slots = _case(rows, r, k, n)
    out = tri.lora_delta(x, a, b, slots)
    assert_close(out, ref.lora_delta(x, a, b, slots))
    assert not out[slots < 0].any()


def test_half_precision_activations():
    x, a, b, slots = _case(4, 8, 64, 160, torch.bfloat16)
    assert_close(tri.lora_delta(x, a, b, slots), ref.lora_delta(x, a, b, slots))
