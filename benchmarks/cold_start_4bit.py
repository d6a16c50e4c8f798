"""benchmarks/cold_start_stages.py on SmolLM2 served from its Q4_1 file kept 4-bit (the
folder the pool imports the GGUF to, scripts/real_model.py): a replica's load stage by
stage against a plain read() of its weight file. Issue 32's target: ready within 1.5x
that read. The report is also written to benchmarks/results/cold_start_4bit.txt.

    .venv/bin/python benchmarks/cold_start_4bit.py [--trials 3]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import cold_start_stages  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    from scripts.real_model import smollm2_dir

    cold_start_stages.main(["--model", str(smollm2_dir(quantized=True)), *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
