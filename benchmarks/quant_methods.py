"""Our own 4-bit quantizers (runtime/quantize) on a real model: held-out perplexity of
each against the float model, all through our engine.

SmolLM2-135M-Instruct (scripts/real_model.py: imported from its Q4_1 GGUF into float32,
so its weights already lie on a 4-bit grid of group 32 with float16 scales and mins;
quantizing them again still rounds: these grids place their minimum on a multiple of
the scale, Q4_1's anywhere) quantized four ways at --group, each written as a Hugging Face folder
the engine serves kept 4-bit. The default group is 64: SmolLM2's hidden size, 576, is
4.5 groups of 128, which AWQ cannot quantize and the engine's reader does not take (a
GPTQ folder's last group would be partial). The four:
- rtn: plain round-to-nearest, asymmetric min-max per group, written as GPTQ (no error
  correction: the baseline);
- gptq: GPTQ, layer by layer on the quantized layers' outputs;
- gptq desc_act: GPTQ taking the columns by decreasing Hessian diagonal (g_idx written);
- awq: AWQ's scale search and clipping, then round-to-nearest, written as AWQ GEMM.
Calibration: the docstrings of thawpool's own modules (runtime/quantize/calibration.py);
perplexity: this repository's README.md and docs/*.md (benchmarks/quant_quality.py),
text the calibration never saw. Target (issue 32): within 3% of the float model.
The report is also written to benchmarks/results/quant_methods.txt.

    .venv/bin/python benchmarks/quant_methods.py [--model DIR] [--group 64] [--samples 16]
        [--seq-len 256] [--awq-samples 4] [--ppl-tokens 2048] [--threads 2]
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quant_quality import held_out_docs, perplexity, verdict  # noqa: E402

TARGET = 0.03


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a float model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--group", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--samples", type=int, default=16, help="GPTQ calibration sequences")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sequence")
    p.add_argument("--awq-samples", type=int, default=4, help="AWQ calibration sequences (its search runs "
                   "each block 20 times)")
    p.add_argument("--ppl-tokens", type=int, default=2048)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--stride", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def measured(folder: Path, ids: list[int], args: argparse.Namespace) -> float:
    """Held-out perplexity of the folder served by our engine (one engine at a time)."""
    from runtime import LLM

    llm = LLM(str(folder), kv_cache_tokens=args.window + 64, enable_prefix_caching=False)
    try:
        value: float = perplexity(llm.engine, ids, args.window, args.stride)
        return value
    finally:
        del llm
        gc.collect()


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    import torch
    from runtime.core.tokenizer import Tokenizer
    from runtime.quantize.folder import Options, quantize_folder
    from scripts.real_model import smollm2_dir

    torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else smollm2_dir()
    ids = Tokenizer(model).encode(held_out_docs())[:args.ppl_tokens]
    group = args.group
    variants = {
        "rtn": Options("rtn", group),
        "gptq": Options("gptq", group, samples=args.samples, seq_len=args.seq_len),
        "gptq desc_act": Options("gptq", group, desc_act=True, samples=args.samples, seq_len=args.seq_len),
        "awq": Options("awq", group, samples=args.awq_samples, seq_len=args.seq_len),
    }
    print(f"model {model}, group {group}, torch threads {args.threads}")
    print(f"calibration: docstrings of thawpool's modules, {args.samples} x {args.seq_len} tokens "
          f"(AWQ: {args.awq_samples} x {args.seq_len}); held out: README.md + docs/*.md, {len(ids)} tokens, "
          f"window {args.window}, stride {args.stride}")
    ppl = {"fp32": measured(model, ids, args)}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="quant-methods-") as tmp:
        for name, options in variants.items():
            started = time.perf_counter()
            folder = quantize_folder(model, Path(tmp) / name.replace(" ", "-"), options)
            seconds[name] = time.perf_counter() - started
            ppl[name] = measured(folder, ids, args)
            print(f"  {name}: quantized in {seconds[name]:.0f} s, perplexity {ppl[name]:.3f}", flush=True)
    print(f"{'method':<15} {'perplexity':>10} {'vs fp32':>9} {'quantize s':>10}  within {TARGET:.0%} of fp32")
    for name, value in ppl.items():
        gap = value / ppl["fp32"] - 1
        took = f"{seconds[name]:.0f}" if name in seconds else "-"
        met = verdict(gap <= TARGET) if name != "fp32" else "-"
        print(f"{name:<15} {value:>10.3f} {gap:>+9.2%} {took:>10}  {met}")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
