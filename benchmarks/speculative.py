"""Speculative decoding (n-gram prompt lookup) vs none, at batch 1 and batch 32, one run.

Copy-heavy workload ("edit this text": the output repeats spans of the prompt). A model
with random weights does not copy on its own, so the benchmark model is constructed to:
its attention output projections are zeroed (attention is still computed in full, so
every step costs what it would), which makes greedy decoding a fixed map token -> next
token whose trajectories end in cycles. Each prompt is such a trajectory (a "document"
of --prompt-len tokens), and its continuation walks the same cycle again: copying.
Greedy, ignore_eos; outputs are checked equal with and without speculation, and the
acceptance rate printed says how copy-heavy the run was. Ratios are given per wall
second and per CPU second of this process (the latter is robust to a busy machine).
Targets: >= 1.5x output tok/s at batch 1; >= 0.95x at batch 32 (backoff turns it off).

Read the batch-1 speedup as a ceiling, not a typical figure: the model is built to loop,
so n-gram lookup guesses right far more often than a trained model on ordinary text
would let it (the acceptance rate printed is the measure); random weights, fp32, CPU.
The report, with the machine's details, is also written to benchmarks/results/speculative.txt.

    .venv/bin/python benchmarks/speculative.py                      # ~30 s on 2 quiet CPU cores
    .venv/bin/python benchmarks/speculative.py --batch1-requests 1 --output-len 48 --batch-output-len 16
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCH_SPEC = dict(arch="llama", hidden_size=384, intermediate_size=1152, num_hidden_layers=6,
                  num_attention_heads=6, num_key_value_heads=2, vocab_size=4096,
                  max_position_embeddings=2048)


def make_copying_model(model_dir: Path) -> None:
    """A random model whose attention output projections are zero (see the docstring)."""
    from safetensors.torch import load_file, save_file
    from tests.support.model_factory import make_model

    make_model(model_dir, **BENCH_SPEC)
    path = model_dir / "model.safetensors"
    weights = load_file(path)
    for name, w in weights.items():
        if name.endswith("self_attn.o_proj.weight"):
            w.zero_()
    save_file(weights, path, metadata={"format": "pt"})


def next_token_map(llm) -> list[int]:
    """Greedy next token of every token: with no attention output it ignores the context."""
    from runtime import SamplingParams

    vocab = BENCH_SPEC["vocab_size"]
    outs = llm.generate([[t] for t in range(vocab)], SamplingParams(max_tokens=1, temperature=0.0,
                                                                     ignore_eos=True))
    return [o.token_ids[0] for o in outs]


def make_prompts(step: list[int], n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        tokens = [rng.randrange(5, len(step))]
        while len(tokens) < length:
            tokens.append(step[tokens[-1]])
        prompts.append(tokens)
    return prompts


def run(llm, prompts, params, concurrent: bool) -> tuple[float, float, list[list[int]]]:
    """Output tok/s per wall and per CPU second; batch 1 runs the prompts one after another."""
    started, cpu = time.perf_counter(), time.process_time()
    if concurrent:
        outs = llm.generate(prompts, params)
    else:
        outs = [llm.generate([p], params)[0] for p in prompts]
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    tokens = [o.token_ids for o in outs]
    produced = sum(map(len, tokens))
    return produced / wall, produced / cpu, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch1-requests", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--batch-output-len", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a folder made by a previous run")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from runtime import LLM, SamplingParams
    model_dir = args.model_dir or Path(tempfile.mkdtemp(prefix="thawpool-spec-")) / "llama"
    if not (model_dir / "config.json").is_file():
        make_copying_model(model_dir)
    spec = {"method": "ngram", "k": args.k, "n": args.n}
    engines = {"off": LLM(str(model_dir), kv_cache_tokens=65536, enable_prefix_caching=False),
               "ngram": LLM(str(model_dir), kv_cache_tokens=65536, enable_prefix_caching=False,
                            speculative=spec)}
    for llm in engines.values():                                   # warm-up
        llm.generate([[5, 6, 7] * 4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    step = next_token_map(engines["off"])
    print(f"model {model_dir} ({BENCH_SPEC['num_hidden_layers']} layers, hidden {BENCH_SPEC['hidden_size']}, "
          f"attention output zeroed), {args.prompt_len}-token prompts, speculative={spec}, "
          f"{args.threads} threads")
    cases = [("batch 1", make_prompts(step, args.batch1_requests, args.prompt_len, args.seed),
              args.output_len, False),
             (f"batch {args.batch}", make_prompts(step, args.batch, args.prompt_len, args.seed + 1),
              args.batch_output_len, True)]
    for name, prompts, out_len, concurrent in cases:
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        before = engines["ngram"].engine.stats()
        off, off_cpu, want = run(engines["off"], prompts, params, concurrent)
        on, on_cpu, got = run(engines["ngram"], prompts, params, concurrent)
        after = engines["ngram"].engine.stats()
        proposed = after.spec_proposed - before.spec_proposed
        accepted = after.spec_accepted - before.spec_accepted
        rate = f"{accepted / proposed:.2f}" if proposed else "n/a (backed off)"
        print(f"{name:9s}: off {off:7.1f} tok/s | ngram {on:7.1f} tok/s | ratio {on / off:.2f}x wall, "
              f"{on_cpu / off_cpu:.2f}x per CPU-second | acceptance {rate} ({accepted}/{proposed}) | "
              f"outputs identical: {got == want}")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
