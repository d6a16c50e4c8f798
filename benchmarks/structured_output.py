"""Decode throughput with a JSON schema enforced vs without, same workload, batch 32.

On the real model, SmolLM2-135M-Instruct (scripts/real_model.py): 32 chat requests,
each asking for a different person's record as JSON. Run 1 enforces a JSON schema
(runtime/engine/structured_output.py: llguidance masks computed during the forward pass,
applied as a bitmask in the sampler). Run 2 is the same prompts with no format, each
request held to exactly the number of tokens it produced in run 1 (ignore_eos), so both
runs decode the same tokens in the same batches. Greedy, all 32 in one batch.

Printed: output tok/s of each run and their ratio; the mask cost (run 1's decode time
minus run 2's) as a share of run 1's decode time (target < 10%); and, measured
directly (robust to a busy machine): the time the sampler waited for the masks after
the forward (the critical path) and the time computing them on the helper thread
(overlapped with the forward; all of it would be the cost without the overlap).
--repeats N: each run N times, alternated, the median (by wall time) counts; every
repeat's decode time is printed.
The report, with the machine's details, is also written to benchmarks/results/structured_output.txt.

    .venv/bin/python benchmarks/structured_output.py
    .venv/bin/python benchmarks/structured_output.py --device cuda
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rounds import median_round, shown  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 60},
        "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Spanish", "Italian"]},
                      "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "country": {"type": "string", "maxLength": 30}},
                    "required": ["city", "country"], "additionalProperties": False},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "languages", "address", "employed"],
    "additionalProperties": False,
}
PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Marie Curie", "Nikola Tesla", "Emmy Noether",
          "Leonhard Euler", "Carl Gauss", "Rosalind Franklin", "Isaac Newton", "Albert Einstein",
          "Katherine Johnson", "Srinivasa Ramanujan", "Hedy Lamarr", "Claude Shannon", "Barbara Liskov",
          "Donald Knuth", "Edsger Dijkstra", "Tim Berners-Lee", "Linus Torvalds", "Margaret Hamilton",
          "John von Neumann", "Sophie Germain", "Blaise Pascal", "Ada Yonath", "Dorothy Hodgkin",
          "Niels Bohr", "Max Planck", "Lise Meitner", "Richard Feynman", "Vera Rubin", "Paul Dirac"]


def prompts(tokenizer, n: int) -> list[list[int]]:
    keys = ", ".join(SCHEMA["properties"])
    return [tokenizer.encode_chat([{"role": "user", "content": f"Write a JSON record for {PEOPLE[i % len(PEOPLE)]} "
                                                               f"with the fields {keys}."}])
            for i in range(n)]


def run(llm, prompt_ids, params) -> tuple[float, float, int, list]:
    """(wall seconds, decode seconds, output tokens, outputs); decode = wall minus the first step."""
    started = time.perf_counter()
    outs = llm.generate(prompt_ids, params)
    wall = time.perf_counter() - started
    first_token = max(o.metrics.ttft_s for o in outs)
    return wall, wall - first_token, sum(len(o.token_ids) for o in outs), outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the real model")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from runtime import LLM, SamplingParams
    from wire.response_format import json_schema_output

    if args.model_dir is None:
        from scripts.real_model import smollm2_dir
        args.model_dir = smollm2_dir()
    llm = LLM(str(args.model_dir), device=args.device, dtype="float32", max_num_seqs=args.batch)
    prompt_ids = prompts(llm.tokenizer, args.batch)
    guided = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, structured_output=json_schema_output(SCHEMA))
    llm.generate(prompt_ids[:2], guided)   # warm: the grammar tokenizer (built on first use), the grammar

    times = llm.engine.structured.times
    times.mask_s = times.wait_s = 0.0
    guided_runs = [run(llm, prompt_ids, [guided] * args.batch)]
    outs = guided_runs[0][3]
    same = [SamplingParams(max_tokens=len(o.token_ids), temperature=0.0, ignore_eos=True) for o in outs]
    plain_runs = [run(llm, prompt_ids, same)]
    for _ in range(args.repeats - 1):   # alternated, so both see the same machine
        guided_runs.append(run(llm, prompt_ids, [guided] * args.batch))
        plain_runs.append(run(llm, prompt_ids, same))
    mask_s, wait_s = times.mask_s / args.repeats, times.wait_s / args.repeats
    g_wall, g_decode, g_tokens, _ = median_round(guided_runs, key=lambda r: r[0])
    p_wall, p_decode, p_tokens, _ = median_round(plain_runs, key=lambda r: r[0])
    valid = sum(_parses(o.text) for o in outs)
    assert p_tokens == g_tokens, (p_tokens, g_tokens)

    print(f"model {args.model_dir.name} on {args.device}, {args.threads} threads | batch {args.batch}, "
          f"{g_tokens} output tokens per run, greedy; {valid}/{args.batch} outputs parse")
    print(f"with JSON schema: {g_tokens / g_decode:8.1f} output tok/s  (wall {g_wall:.2f} s, decode {g_decode:.2f} s)")
    print(f"no format:        {p_tokens / p_decode:8.1f} output tok/s  (wall {p_wall:.2f} s, decode {p_decode:.2f} s)")
    print(f"ratio (schema / none): {p_decode / g_decode:.3f}x decode throughput; decode s, with schema "
          f"{shown([r[1] for r in guided_runs])}, none {shown([r[1] for r in plain_runs])}")
    print(f"mask cost: {100 * (g_decode - p_decode) / g_decode:.1f}% of decode time by the difference of "
          f"the runs (target < 10%; noisy on a busy machine)")
    print(f"  on the critical path (sampler waiting for masks after the forward): {1e3 * wait_s:.0f} ms = "
          f"{100 * wait_s / g_decode:.2f}% of decode; computing them (helper thread, overlapping the "
          f"forward): {1e3 * mask_s:.0f} ms = {100 * mask_s / g_decode:.2f}%")


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    from benchmarks.results import recorded
    with recorded(__file__):
        main()
