"""thawpool keeping a 4-bit GGUF 4-bit against llama.cpp's llama-server on the same file.

SmolLM2-135M-Instruct's own Q4_1 file (scripts/real_model.py), served by llama-server as it
is and by thawpool's server from its import (its Q4_1 matrices kept 4-bit, run by the C
W4A16 kernel, and with cpu_low_precision by W4A8 from kernels/cpu/features.py's row count
up), through benchmarks/peers.py's workload, client and checks, twice in one run:

- throughput: --concurrency 32 requests in flight (issue 32's target: at least 1.5x
  llama-server's output tokens/s);
- batch 1: one request at a time, short prompts and longer outputs so that decoding
  dominates (target: at least 1.0x its tokens/s).

The report is also written to benchmarks/results/peers_4bit.txt.

    .venv/bin/python -m benchmarks.peers_4bit [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import peers  # noqa: E402

PAIRINGS = "q4_1,q4_1-lowp"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--num-requests", type=int, default=96, help="of the throughput run")
    args = p.parse_args(argv)
    common = ["--pairings", PAIRINGS, "--threads", str(args.threads)]
    print("== throughput: concurrency 32 ==", flush=True)
    peers.main([*common, "--num-requests", str(args.num_requests), "--concurrency", "32", "--target", "1.5"])
    print("\n== batch 1: one request at a time ==", flush=True)
    peers.main([*common, "--num-requests", "6", "--concurrency", "1", "--input-len", "8", "32",
                "--output-len", "96", "128", "--target", "1.0", "--skip-offline"])


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
