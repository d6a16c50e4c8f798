"""Shared by the test_cpu_*.py modules: skip without a C compiler, and run a test
under a chosen torch thread count (the C kernels split their work by it)."""
from __future__ import annotations

import contextlib
import shutil

import pytest
import torch

if shutil.which("cc") is None and shutil.which("gcc") is None:
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
