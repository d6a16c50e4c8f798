"""Group-quantized linear layers on the CPU: the C W4A16 and W4A8 kernels against their peers.

    .venv/bin/python benchmarks/group_linear.py [--rows 1 8 32] [--rounds 15] [--threads N] [--paths]

For SmolLM2-135M's linear shapes (fused q/k/v, o, fused gate/up, down, the lm head), a
4-bit weight laid out as its Q4_1 file is repacked (group 32, fp16 scale and offset),
at each number of rows M of x, the median over rounds of:

- w4a16: kernels/cpu/group_linear.py:group_linear (as dispatched: the decoding kernel
  below GEMM_MIN_ROWS rows, the widened weight and torch's GEMM from there on)
- w4a8:  kernels/cpu/group_linear.py:w4a8_linear
- int8:  kernels/cpu/int8_matmul.py:int8_linear, an int8 weight of the same shape
- fp32:  F.linear over the fp32 weight

and each one's time over w4a16's. --paths also times the two W4A16 paths apart
(decoded: the C kernel; widened: C widening + torch's GEMM), which is what
GEMM_MIN_ROWS and features.W4A8_MIN_ROWS are chosen from. The report is written to
benchmarks/results/group_linear.txt.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rounds import alternating_times  # noqa: E402
from kernels import group_quant, int8  # noqa: E402
from kernels.cpu import group_linear, int8_matmul  # noqa: E402
from kernels.group_quant import GroupQuantized  # noqa: E402

# (name, K, N): SmolLM2-135M, hidden 576, 9 heads and 3 kv heads of 64, intermediate 1536
SHAPES = [("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576),
          ("lm_head", 576, 49152)]
CALLS_PER_ROUND = 10


def q4_1_like(n: int, k: int) -> GroupQuantized:
    g = torch.Generator().manual_seed(0)
    groups = k // 32
    codes = group_quant.pack_nibbles(torch.randint(0, 16, (n, k), generator=g))
    return GroupQuantized(codes=codes, scales=(torch.rand(n, groups, generator=g) * 0.01).half(), bits=4,
                          group=32, offsets=(-torch.rand(n, groups, generator=g) * 0.08).half())


def peers(k: int, n: int, rows: int, paths: bool) -> dict:
    w = q4_1_like(n, k)
    dense = group_quant.dequantize(w)
    qweight, scale = int8.quantize_per_channel(dense)
    x = torch.randn(rows, k)
    fns = {"w4a16": lambda: group_linear.group_linear(x, w),
           "w4a8": lambda: group_linear.w4a8_linear(x, w),
           "int8": lambda: int8_matmul.int8_linear(x, qweight, scale),
           "fp32": lambda: F.linear(x, dense)}
    if paths:
        fns["decoded"] = lambda: group_linear.decoded_linear(x, w)
        fns["widened"] = lambda: group_linear.widened_linear(x, w)
    return fns


def repeated(fn):
    def run() -> None:
        for _ in range(CALLS_PER_ROUND):
            fn()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch's (and the C kernels') thread count")
    parser.add_argument("--paths", action="store_true", help="also time the two W4A16 paths apart")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"median of {args.rounds} rounds of {CALLS_PER_ROUND} calls, us per call; (x w4a16's time)")
    for rows in args.rows:
        for name, k, n in SHAPES:
            fns = peers(k, n, rows, args.paths)
            times = alternating_times({key: repeated(fn) for key, fn in fns.items()}, args.rounds)
            med = {key: statistics.median(v) / CALLS_PER_ROUND * 1e6 for key, v in times.items()}
            cells = "  ".join(f"{key} {us:8.1f} ({us / med['w4a16']:5.2f}x)" for key, us in med.items())
            print(f"M={rows:<3} {name:8} K={k:<5} N={n:<6} {cells}", flush=True)


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
