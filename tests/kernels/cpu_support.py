"""Shared by the test_cpu_*.py modules: skip without a C compiler, and run a test
under a chosen torch thread count (the C kernels split their work by it)."""
from __future__ import annotations

import contextlib

import pytest
import torch

from kernels.cpu import build

if build.compiler() is None:
    pytest.skip("no C compiler (cc or gcc) on PATH to build kernels/cpu", allow_module_level=True)

# fp32, summation order only
RTOL = ATOL = 2e-5


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def assert_matmul_close(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None) -> None:
    """out = x @ weight.T + bias, up to the rounding of fp32 sums in any order.

    The truth is computed in float64. Any summation order of K fp32 terms is off by
    at most about K/16 + 4 roundings of the sum of their magnitudes when the sums run
    in 16 vector lanes (the C kernels), and a tiled GEMM does no worse; 8 * sqrt(K)
    covers that up to K = 16,000 without being so loose that a dropped term, a wrong
    row or a wrong scale would pass.
    """
    x64, w64 = x.double().reshape(-1, x.shape[-1]), weight.double()
    truth = x64 @ w64.T + (bias.double() if bias is not None else 0)
    terms = x64.abs() @ w64.abs().T
    eps = torch.finfo(torch.float32).eps
    bound = 8 * x.shape[-1] ** 0.5 * eps * terms + 2 * eps * truth.abs() + 1e-30
    err = (out.double().reshape(truth.shape) - truth).abs()
    assert (err <= bound).all(), f"off by {(err / bound).max().item():.2f}x the rounding bound"
