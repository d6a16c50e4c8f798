"""Triton kernels run on the CPU through triton's interpreter unless a run asks
otherwise (TRITON_INTERPRET=0 on a CUDA machine). It must be set before any
@triton.jit function is defined, i.e. before kernels.triton.* is imported.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
