"""Shared by the test_triton_*.py modules: where the kernels run and how close is close."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="triton not installed")

# The interpreter runs kernels on CPU tensors; compiled Triton needs CUDA ones.
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"

# fp32: summation order only. fp16: one ulp. bf16: two ulps, because the
# interpreter truncates fp32 -> bf16 where torch (and the GPU) round to nearest,
# and a kernel rounds to bf16 up to twice where the reference does (rms_norm:
# the normed row, then the weighted output).
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor,
                 rounded_to: torch.dtype | None = None) -> None:
    """rounded_to: the narrowest dtype the computation rounds to (default: the output's)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    rtol, atol = TOLERANCES[rounded_to or expected.dtype]
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=rtol, atol=atol)
