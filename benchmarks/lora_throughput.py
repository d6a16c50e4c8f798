"""Many LoRA adapters on one SmolLM2 replica (runtime/lora/), offline, against the base
alone and against one merged model per adapter, in one run.

SmolLM2-135M-Instruct from its Q4_1 file kept 4-bit (scripts/real_model.py); 8 random
rank-16 adapters on all seven projections, made with peft on the float32 folder's
architecture (A and B random, so every delta is far from zero); 32 requests (prompts of
64 random token ids, 64 greedy tokens each, ignore_eos) at concurrency 32:

- base: the 32 requests on the base alone (the ceiling);
- adapters: the same 32 requests spread over the 8 adapters (4 each) in one engine with
  max_loras 8 (issue 33's target: at least 0.8x the base's output tok/s);
- merged: what 8 deployments of one merged fine-tune each do on the same two cores: each
  serves its 4 requests in turn, one engine at a time (its own weights, so its own batch;
  modelled as the base engine running 4 requests 8 times: merged weights cost what the
  base's cost). Target: the adapters at least 4x this.
- load: an adapter read from the node's disk into a running engine (add_lora, then its
  copy into a slot) 50 times; the 99th percentile (target 50 ms).

Rounds alternate; the median round is the figure and every round is printed. The report
is also written to benchmarks/results/lora_throughput.txt.

    .venv/bin/python benchmarks/lora_throughput.py [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rounds import shown  # noqa: E402

ADAPTERS, RANK, REQUESTS, PROMPT, OUTPUT = 8, 16, 32, 64, 64
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(base: Path, folder: Path) -> list[Path]:
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    made = []
    for i in range(ADAPTERS):
        torch.manual_seed(i)
        config = peft.LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS, init_lora_weights=False)
        wrapped = peft.get_peft_model(model, config)
        wrapped.save_pretrained(folder / f"a{i}")
        model = wrapped.unload()          # the base again, for the next adapter
        made.append(folder / f"a{i}")
    return made


def tok_per_s(llm, prompts: list[list[int]], loras: list) -> float:
    from wire.sampling import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, lora=loras)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def merged_tok_per_s(base_llm, prompts: list[list[int]]) -> float:
    """8 deployments one after another, each with its 4 requests."""
    from wire.sampling import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
    per = REQUESTS // ADAPTERS
    start, tokens = time.perf_counter(), 0
    for i in range(ADAPTERS):
        tokens += sum(len(o.token_ids) for o in base_llm.generate(prompts[i * per:(i + 1) * per], params))
    return tokens / (time.perf_counter() - start)


def load_seconds(llm, folder: Path, times: int) -> list[float]:
    """add_lora (read from disk, checked) and the copy into a slot, per load."""
    engine, out = llm.engine, []
    for i in range(times):
        name = f"load{i}"
        start = time.perf_counter()
        engine.add_lora(name, str(folder))
        engine.runner.load_lora(i % engine.config.max_loras, engine.adapters[name])
        out.append(time.perf_counter() - start)
        engine.remove_lora(name)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import torch

    from runtime.llm import LLM
    from scripts.real_model import smollm2_dir

    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(PROMPT)] for _ in range(REQUESTS)]
    loras = [f"a{i % ADAPTERS}" for i in range(REQUESTS)]
    with tempfile.TemporaryDirectory() as tmp:
        folders = make_adapters(smollm2_dir(), Path(tmp))
        # no prefix cache: every round computes every prompt (the rounds repeat them)
        options = dict(max_num_seqs=REQUESTS, kv_cache_tokens=REQUESTS * (PROMPT + OUTPUT + 32),
                       enable_prefix_caching=False)
        base = LLM(str(smollm2_dir(quantized=True)), **options)
        multi = LLM(str(smollm2_dir(quantized=True)), max_loras=ADAPTERS, max_lora_rank=RANK, **options)
        for i, folder in enumerate(folders):
            multi.engine.add_lora(f"a{i}", str(folder))
        print(f"SmolLM2-135M-Instruct Q4_1 kept 4-bit, {args.threads} threads; {REQUESTS} requests of "
              f"{PROMPT} prompt tokens, {OUTPUT} greedy tokens each; {ADAPTERS} rank-{RANK} adapters on "
              f"every projection; output tok/s, {args.rounds} rounds alternating")
        tok_per_s(multi, prompts[:4], loras[:4])          # warm-up: every kernel built
        rounds: dict[str, list[float]] = {"base": [], "adapters": [], "merged": []}
        for _ in range(args.rounds):
            rounds["base"].append(tok_per_s(base, prompts, [None] * REQUESTS))
            rounds["adapters"].append(tok_per_s(multi, prompts, loras))
            rounds["merged"].append(merged_tok_per_s(base, prompts))
        for name, values in rounds.items():
            print(f"{name:9s} {shown(values, digits=1)}")
        med = {name: statistics.median(values) for name, values in rounds.items()}
        vs_base, vs_merged = med["adapters"] / med["base"], med["adapters"] / med["merged"]
        print(f"adapters / base: {vs_base:.2f}x (target 0.8x: {'met' if vs_base >= 0.8 else 'not met'})")
        print(f"adapters / 8 merged deployments: {vs_merged:.2f}x "
              f"(target 4x: {'met' if vs_merged >= 4 else 'not met'})")
        loads = load_seconds(multi, folders[0], 50)
        p99 = sorted(loads)[int(0.99 * (len(loads) - 1))]
        print(f"adapter load from disk into a running engine: {shown(loads, scale=1e3, digits=1)} ms; "
              f"p99 {p99 * 1e3:.1f} ms (target 50 ms: {'met' if p99 <= 0.05 else 'not met'})")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
