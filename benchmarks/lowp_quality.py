"""Low-precision GEMMs (bf16, W8A8) against fp32: quality on the real model, GEMM speed.

The dispatch (kernels/cpu/features.py) turns bf16 linears on where the CPU has avx512_bf16
or amx_bf16, and W8A8 for int8 weights over many rows where it has avx512_vnni, avx_vnni
or amx_int8. This script forces each path on with made-up CPU flags
(get_kernels(device, features=...)), whatever this CPU has, and measures:

- perplexity of SmolLM2-135M-Instruct (fp32 checkpoint) on held-out text (this
  repository's docs, as benchmarks/quant_quality.py) with the linears in fp32, bf16,
  weight-only int8 and W8A8; target: bf16 and W8A8 within 1% of fp32. Every window is
  one prefill of --window rows, so the int8 model runs W8A8 in every linear layer;
- GEMM throughput on a prefill-sized shape (--rows x K -> N, SmolLM2's gate/up by
  default) of each path against fp32 oneDNN measured in the same run, alternating, the
  median of --repeats (every repeat printed); target: bf16 and W8A8 at least 1.5x fp32 where the CPU has the
  instructions. It prints which paths the dispatch picks on this CPU; where the CPU
  lacks the instructions the forced paths run emulated, and the ratio shows only that
  the dispatch is right not to pick them.

The engine takes no option to choose kernels yet, so the forced models are loaded with
runtime.models.decoder's get_kernels bound to the forced flags for the duration of the load.
The report is also written to benchmarks/results/lowp_quality.txt.

    .venv/bin/python benchmarks/lowp_quality.py [--ppl-tokens 2048] [--threads 2]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quant_quality import held_out_docs, perplexity  # noqa: E402
from benchmarks.rounds import alternating_times, medians, shown  # noqa: E402
from kernels.cpu.features import CpuFeatures, detect, plan  # noqa: E402

BF16 = CpuFeatures(avx512_bf16=True)          # bf16 linears (oneDNN blocks the weights only if this CPU can)
W8A8 = CpuFeatures(avx512_vnni=True)          # W8A8 from W8A8_MIN_ROWS rows up
NONE = CpuFeatures()                          # today's fp32 and weight-only int8 paths
TARGET_PPL = 0.01
TARGET_SPEED = 1.5


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--ppl-tokens", type=int, default=2048)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--stride", type=int, default=256)
    p.add_argument("--rows", type=int, default=256, help="GEMM rows (prefill tokens)")
    p.add_argument("--k", type=int, default=576)
    p.add_argument("--n", type=int, default=3072)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def describe_dispatch(features: CpuFeatures) -> str:
    chosen = plan(features)
    int8 = (f"W8A8 from {chosen.w8a8_min_rows} rows, weight-only below" if chosen.w8a8_min_rows is not None
            else "weight-only at every row count")
    return f"float linears {chosen.linear.value}, int8 weights {int8}"


def lacks(features: CpuFeatures) -> list[str]:
    missing = []
    if not features.bf16_gemm:
        missing.append("bf16 (avx512_bf16 / amx_bf16)")
    if not features.int8_gemm:
        missing.append("int8 dot products (avx512_vnni / avx_vnni / amx_int8)")
    return missing


# ---- GEMM speed


def gemm_speed(args: argparse.Namespace, here: CpuFeatures) -> None:
    import torch
    from kernels.dispatch import get_kernels
    from kernels.int8 import quantize_per_channel

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(args.rows, args.k, generator=g), torch.randn(args.n, args.k, generator=g) / args.k ** 0.5
    qweight, scale = quantize_per_channel(w)
    fp32, bf16, w8a8 = (get_kernels("cpu", features=f) for f in (NONE, BF16, W8A8))
    packed32, packed16 = fp32.pack_linear(w), bf16.pack_linear(w)
    times = alternating_times({
        "fp32": lambda: fp32.linear(x, packed32),
        "bf16": lambda: bf16.linear(x, packed16),
        "int8 weight-only": lambda: fp32.int8_linear(x, qweight, scale),
        "W8A8": lambda: w8a8.int8_linear(x, qweight, scale),
    }, args.repeats)
    mid = medians(times)
    flops = 2 * args.rows * args.k * args.n
    print(f"GEMM {args.rows} x {args.k} -> {args.n}, median of {args.repeats} (GFLOP/s; throughput vs fp32):")
    for name, s in mid.items():
        print(f"  {name:17s} {flops / s / 1e9:7.1f}  {mid['fp32'] / s:5.2f}x   ms per call: {shown(times[name], 1e3)}")
    for name, has in (("bf16", here.bf16_gemm), ("W8A8", here.int8_gemm)):
        ratio = mid["fp32"] / mid[name]
        verdict = (("met" if ratio >= TARGET_SPEED else "NOT met") if has
                   else "cannot be shown: this CPU lacks the instructions, the dispatch does not pick it here")
        print(f"{name} / fp32 throughput {ratio:.2f}x (target >= {TARGET_SPEED}x: {verdict})")


# ---- perplexity


@contextlib.contextmanager
def kernels_for(features: CpuFeatures) -> Iterator[None]:
    """Models built inside with cpu_low_precision see `features` as this CPU's flags (made-up
    ones force a path on a CPU that lacks its instructions, emulated)."""
    from runtime.models import decoder

    detect = decoder.detect_cpu
    decoder.detect_cpu = lambda: features  # type: ignore[attr-defined]
    try:
        yield
    finally:
        decoder.detect_cpu = detect  # type: ignore[attr-defined]


def load(model: Path, features: CpuFeatures, quantization: Optional[str], kv_tokens: int) -> Any:
    from runtime import LLM

    with kernels_for(features):
        return LLM(str(model), dtype="float32", quantization=quantization, kv_cache_tokens=kv_tokens,
                   enable_prefix_caching=False, cpu_low_precision=True)


def quality(args: argparse.Namespace) -> None:
    from scripts.real_model import smollm2_dir

    model = Path(args.model) if args.model else smollm2_dir()
    variants = {"fp32": (NONE, None), "bf16": (BF16, None), "int8 weight-only": (NONE, "int8"),
                "W8A8": (W8A8, "int8")}
    ppl: dict[str, float] = {}
    ids: list[int] = []
    for name, (features, quantization) in variants.items():
        llm = load(model, features, quantization, args.window + 64)
        ids = ids or llm.tokenizer.encode(held_out_docs())[:args.ppl_tokens]
        started = time.perf_counter()
        ppl[name] = perplexity(llm.engine, ids, args.window, args.stride)
        print(f"  {name:17s} perplexity {ppl[name]:.3f}  ({time.perf_counter() - started:.0f} s)")
        llm.close()
    print(f"perplexity of {model.name} (fp32 checkpoint) over {len(ids)} held-out tokens, "
          f"window {args.window}, stride {args.stride}:")
    for name in ("bf16", "int8 weight-only", "W8A8"):
        gap = ppl[name] / ppl["fp32"] - 1
        target = (f"target within {TARGET_PPL:.0%}: {'met' if abs(gap) <= TARGET_PPL else 'NOT met'}"
                  if name in ("bf16", "W8A8") else "for reference")
        print(f"  {name} vs fp32: {ppl[name]:.3f} vs {ppl['fp32']:.3f} ({gap:+.3%}; {target})")


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    here = detect()
    print(f"this CPU: {describe_dispatch(here)} (what get_kernels('cpu') picks); torch threads {args.threads}")
    missing = lacks(here)
    if missing:
        print(f"this CPU lacks {' and '.join(missing)}: those paths run emulated below, so the speed "
              "target cannot be shown here, and the dispatch keeps fp32 / weight-only int8")
    gemm_speed(args, here)
    quality(args)


if __name__ == "__main__":
    from benchmarks.results import recorded  # type: ignore[attr-defined]  # mypy finds the results/ folder

    with recorded(__file__):
        main()
