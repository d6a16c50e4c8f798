"""Offline decoding of SmolLM2 from its Q4_1 file kept 4-bit: decode steps replayed from
their recorded C kernel calls (runtime/engine/cpu_replay.py, the default) against the
same engine run eagerly, and against llama.cpp's own decode benchmark on the same file.

- thawpool: LLM over the imported folder (scripts/real_model.py), `--batch` greedy
  requests of a short prompt decoding --tokens each; the time per decode step after the
  first (a step of a batch of sequences), replayed and eager, alternating per round;
- llama.cpp: `llama-bench -p 0 -n <tokens> -t <threads>` (its text generation test, batch
  1, its own repetitions), the time per generated token; only beside batch 1.

Every round is printed; the median round is the figure. The report is also written to
benchmarks/results/decode_replay.txt.

    .venv/bin/python benchmarks/decode_replay.py [--rounds 5] [--tokens 128] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rounds import shown  # noqa: E402

PROMPT = "The capital of France is"


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128, help="decoded per request")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    return p.parse_args(argv)


def step_seconds(llm, batch: int, tokens: int) -> float:
    """Seconds per decode step of `batch` requests decoding `tokens` each (the prefill step
    and the first decode step, which records a replay, not counted)."""
    from wire.sampling import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{time.monotonic_ns()}-{i}", llm.tokenizer.encode(PROMPT), params)
    engine.step()
    engine.step()
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return (time.perf_counter() - start) / steps


def llama_bench(gguf: Path, tokens: int, threads: int) -> Optional[list[float]]:
    """Seconds per generated token of each of llama-bench's repetitions; None without it."""
    from benchmarks.peers import CACHE, ensure_llama_server

    server = ensure_llama_server(CACHE, build=False)
    if server is None:
        return None
    run = subprocess.run([str(server.parent / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(tokens),
                          "-t", str(threads), "-r", "5", "-o", "json"],
                         capture_output=True, text=True, env={"LD_LIBRARY_PATH": str(server.parent)})
    if run.returncode != 0:
        raise SystemExit(f"llama-bench failed ({run.returncode}):\n{run.stderr[-3000:]}")
    found = re.search(r"\[.*\]", run.stdout, re.S)
    assert found is not None, run.stdout
    samples = json.loads(found.group(0))[0]["samples_ns"]
    return [ns / 1e9 / tokens for ns in samples]


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    import torch

    from runtime.llm import LLM
    from scripts.real_model import smollm2_dir, smollm2_gguf

    torch.set_num_threads(args.threads)
    folder = smollm2_dir(quantized=True)
    engines = {"replayed": LLM(str(folder)), "eager": LLM(str(folder), cpu_replay=False)}
    print(f"SmolLM2-135M-Instruct Q4_1 kept 4-bit, {args.threads} threads, greedy, prompt {PROMPT!r}, "
          f"{args.tokens} tokens per request; ms per decode step, {args.rounds} rounds alternating")
    for batch in args.batch:
        for llm in engines.values():
            step_seconds(llm, batch, 8)                    # warm-up: records the replays
        rounds: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                rounds[name].append(step_seconds(llm, batch, args.tokens))
        for name, values in rounds.items():
            print(f"batch {batch}  {name:9s} {shown(values, scale=1e3, digits=2)}")
        ratio = statistics.median(rounds["eager"]) / statistics.median(rounds["replayed"])
        print(f"batch {batch}  replayed / eager: {ratio:.2f}x the decode speed")
        if batch == 1:
            llama = llama_bench(smollm2_gguf(), args.tokens, args.threads)
            if llama is None:
                print("llama-bench: not built (benchmarks/peers.py builds it); no peer")
                continue
            print(f"batch 1  llama-bench {shown(llama, scale=1e3, digits=2)} (tg{args.tokens}, its repetitions)")
            peer = statistics.median(llama)
            print(f"batch 1  replayed / llama.cpp: {peer / statistics.median(rounds['replayed']):.2f}x "
                  f"the decode speed (eager: {peer / statistics.median(rounds['eager']):.2f}x)")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
