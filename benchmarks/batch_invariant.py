"""What the batch-invariant mode costs: offline throughput with `batch_invariant=True`
over the same engine without it, on the same workload, in one run.

In that mode every linear layer runs kernels/cpu/invariant_linear.c (each output element
summed in one fixed order, whatever the batch) instead of oneDNN's GEMM, and every row's
attention, decoding ones included, the prefill kernel (runtime/engine/model_runner.py), so a
request's logprobs are the same bits alone or in any batch (tests/runtime/test_batch_invariant.py
checks that with random batch compositions). The two engines alternate, --rounds times
(every round printed), and the median of each counts, by wall time and by CPU time (the
one to trust on a busy machine). Also written to benchmarks/results/batch_invariant.txt.

    .venv/bin/python benchmarks/batch_invariant.py --real            # SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/batch_invariant.py --num-requests 24  # a random 50M Llama
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_throughput import BENCH_SPEC, make_workload, run_thawpool  # noqa: E402
from benchmarks.rounds import medians  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=384)
    ap.add_argument("--min-output", type=int, default=16)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct instead of random weights")
    args = ap.parse_args()
    args.max_num_seqs = args.max_num_batched_tokens = args.kv_cache_tokens = None

    import torch
    torch.set_num_threads(args.threads)
    if args.real:
        from scripts.real_model import smollm2_dir
        model_dir = smollm2_dir()
    else:
        from tests.support.model_factory import make_model
        model_dir = Path(tempfile.mkdtemp(prefix="thawpool-bench-")) / "llama-50m"
        make_model(model_dir, **BENCH_SPEC)
    work = make_workload(args)
    print(f"model {model_dir} | {args.num_requests} requests, prompts {args.min_prompt}-{args.max_prompt}, "
          f"outputs {args.min_output}-{args.max_output}, {work.output_tokens} output tokens, "
          f"{args.threads} threads, the median of {args.rounds} rounds each")
    rounds: dict[str, list[float]] = {}
    for n in range(args.rounds):
        for invariant in (False, True):
            run = run_thawpool(model_dir, work, args, batch_invariant=invariant)
            mode = "batch-invariant" if invariant else "default"
            print(f"  round {n + 1}: {mode:16s} {run['tok_s']:7.1f} output tok/s, "
                  f"{run['tok_cpu_s']:7.1f} per CPU-second")
            for key in ("tok_s", "tok_cpu_s"):
                rounds.setdefault(f"{mode} {key}", []).append(run[key])
    mid = medians(rounds)
    wall = mid["batch-invariant tok_s"] / mid["default tok_s"]
    cpu = mid["batch-invariant tok_cpu_s"] / mid["default tok_cpu_s"]
    print(f"batch-invariant / default throughput (medians): {wall:.2f}x wall, {cpu:.2f}x per CPU-second "
          f"(the mode's cost: {100 * (1 - cpu):.0f}% of the throughput by CPU time)")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
