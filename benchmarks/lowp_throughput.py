"""Low-precision compute against fp32 on issue 20's mixed workload: engine throughput.

The same real model (SmolLM2-135M-Instruct, the fp32 folder of scripts/real_model.py) and
the same requests as benchmarks/peers.py (96 random-token prompts of 32-384 tokens, 16-128
output tokens each, greedy, ignore_eos), all submitted at once to runtime.LLM.generate,
in four forms measured in one run:

- fp32: the default engine;
- bf16: the fp32 model with cpu_low_precision=True, so its linear layers run in bf16
  through oneDNN where the CPU has avx512_bf16 or amx_bf16;
- int8 weight-only: quantization="int8", the default int8 engine;
- int8 W8A8: quantization="int8" with cpu_low_precision=True, int8 activations from
  kernels/cpu/features.py's W8A8_MIN_ROWS rows up where the CPU has avx512_vnni,
  avx_vnni or amx_int8.

Each is a ratio of output tokens per second against fp32 measured in the same run (the
forms alternate over --rounds, the median of each, every round printed). Target (issue 20): bf16 and W8A8 at least
1.5x fp32 on a CPU with the instructions; on one without them cpu_low_precision must
change nothing (the dispatch keeps fp32 and weight-only int8), which the ratio shows.
The report is also written to benchmarks/results/lowp_throughput.txt.

    .venv/bin/python benchmarks/lowp_throughput.py [--rounds 2] [--num-requests 96]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lowp_quality import describe_dispatch, lacks  # noqa: E402
from benchmarks.rounds import medians  # noqa: E402
from benchmarks.serve import Workload, offline_tok_s  # noqa: E402

TARGET = 1.5
FORMS: dict[str, dict[str, object]] = {
    "fp32": {},
    "bf16 (fp32 model, cpu_low_precision)": {"cpu_low_precision": True},
    "int8 weight-only": {"quantization": "int8"},
    "int8 W8A8 (cpu_low_precision)": {"quantization": "int8", "cpu_low_precision": True},
}
# each low-precision form and the CPU property it needs
NEEDS = {"bf16 (fp32 model, cpu_low_precision)": "bf16_gemm", "int8 W8A8 (cpu_low_precision)": "int8_gemm"}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None, help="default: SmolLM2-135M-Instruct, fp32")
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--input-len", type=int, nargs=2, default=[32, 384], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="each form this many times, alternating; the median reported")
    return p.parse_args(argv)


def verdict(ratio: float, has_instructions: bool) -> str:
    if has_instructions:
        return f"target >= {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'}"
    return "this CPU lacks the instructions: the dispatch keeps fp32 / weight-only, so about 1x is right"


def report(tok_s: dict[str, float], features: object) -> list[str]:
    """`tok_s`: each form's median round."""
    width = max(len(name) for name in tok_s) + 2
    lines = [f"{'form':<{width}}output tok/s   vs fp32   (medians of the rounds)"]
    lines += [f"{name:<{width}}{rate:12.1f}   {rate / tok_s['fp32']:6.2f}x" for name, rate in tok_s.items()]
    lines.append("")
    for name, needs in NEEDS.items():
        ratio = tok_s[name] / tok_s["fp32"]
        lines.append(f"{name} / fp32: {ratio:.2f}x ({verdict(ratio, bool(getattr(features, needs)))})")
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    from kernels.cpu.features import detect
    from scripts.real_model import smollm2_dir

    args = parse_args(argv)
    model_dir = args.model_dir or smollm2_dir()
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    workload = Workload.random(args.num_requests, tuple(args.input_len), tuple(args.output_len), vocab, args.seed)
    here = detect()
    print(f"model {model_dir.name} | {args.num_requests} requests, prompts {args.input_len[0]}-{args.input_len[1]}, "
          f"outputs {args.output_len[0]}-{args.output_len[1]} ({sum(workload.output_lens)} output tokens), all at "
          f"once, greedy, ignore_eos | {args.threads} threads")
    print(f"this CPU with cpu_low_precision: {describe_dispatch(here)}")
    missing = lacks(here)
    if missing:
        print(f"this CPU lacks {' and '.join(missing)}")
    rounds: dict[str, list[float]] = {name: [] for name in FORMS}
    for round_ in range(args.rounds):
        order = list(FORMS) if round_ % 2 == 0 else list(reversed(FORMS))
        for name in order:
            tok_s = offline_tok_s(model_dir, workload, FORMS[name], args.threads)
            print(f"  round {round_ + 1}: {name}: {tok_s:.1f} tok/s", flush=True)
            rounds[name].append(tok_s)
    print("\n".join(["", *report(medians(rounds), here)]))


if __name__ == "__main__":
    from benchmarks.results import recorded  # type: ignore[attr-defined]  # mypy: the folder results/

    with recorded(__file__):
        main()
