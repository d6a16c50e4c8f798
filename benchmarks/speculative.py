"""Speculative decoding (n-gram prompt lookup) vs none, at batch 1 and batch 32, one run.

Copy-heavy workload: each prompt is a span of random tokens repeated several times
("edit this text": the continuation repeats what is already there), greedy, ignore_eos.
With random weights the model's greedy continuation falls into loops over the prompt
and its own output, which is what prompt lookup exploits; the acceptance rate printed
says how copy-heavy the run really was. Outputs are checked equal with and without.
Targets: >= 1.5x output tok/s at batch 1; >= 0.95x at batch 32 (backoff turns it off).

    .venv/bin/python benchmarks/speculative.py                      # ~2-3 minutes on 2 CPU cores
    .venv/bin/python benchmarks/speculative.py --batch1-requests 2 --output-len 64
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCH_SPEC = dict(arch="llama", hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, vocab_size=8192,
                  max_position_embeddings=2048)


def make_prompts(n: int, span: int, repeats: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, BENCH_SPEC["vocab_size"]) for _ in range(span)] * repeats for _ in range(n)]


def run(llm, prompts, params, concurrent: bool) -> tuple[float, list[list[int]]]:
    """Output tok/s; batch 1 runs the prompts one after another, batch N all at once."""
    started = time.perf_counter()
    if concurrent:
        outs = llm.generate(prompts, params)
    else:
        outs = [llm.generate([p], params)[0] for p in prompts]
    wall = time.perf_counter() - started
    tokens = [o.token_ids for o in outs]
    return sum(map(len, tokens)) / wall, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch1-requests", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch-output-len", type=int, default=32)
    ap.add_argument("--span", type=int, default=48, help="tokens in the repeated span")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a folder made by a previous run")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from runtime import LLM, SamplingParams
    from tests.support.model_factory import make_model

    model_dir = args.model_dir or Path(tempfile.mkdtemp(prefix="thawpool-spec-")) / "llama"
    if not (model_dir / "config.json").is_file():
        make_model(model_dir, **BENCH_SPEC)
    spec = {"method": "ngram", "k": args.k, "n": args.n}
    engines = {"off": LLM(str(model_dir), kv_cache_tokens=65536, enable_prefix_caching=False),
               "ngram": LLM(str(model_dir), kv_cache_tokens=65536, enable_prefix_caching=False,
                            speculative=spec)}
    for llm in engines.values():                                   # warm-up
        llm.generate([[5, 6, 7] * 4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    print(f"model {model_dir} ({BENCH_SPEC['num_hidden_layers']} layers, hidden {BENCH_SPEC['hidden_size']}), "
          f"prompts: a {args.span}-token span x {args.repeats}, speculative={spec}, {args.threads} threads")
    cases = [("batch 1", make_prompts(args.batch1_requests, args.span, args.repeats, args.seed),
              args.output_len, False),
             (f"batch {args.batch}", make_prompts(args.batch, args.span, args.repeats, args.seed + 1),
              args.batch_output_len, True)]
    for name, prompts, out_len, concurrent in cases:
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        before = engines["ngram"].engine.stats()
        off, want = run(engines["off"], prompts, params, concurrent)
        on, got = run(engines["ngram"], prompts, params, concurrent)
        after = engines["ngram"].engine.stats()
        proposed = after.spec_proposed - before.spec_proposed
        accepted = after.spec_accepted - before.spec_accepted
        rate = f"{accepted / proposed:.2f}" if proposed else "n/a (backed off)"
        print(f"{name:9s}: off {off:7.1f} tok/s | ngram {on:7.1f} tok/s | ratio {on / off:.2f}x | "
              f"acceptance {rate} ({accepted}/{proposed}) | outputs identical: {got == want}")


if __name__ == "__main__":
    main()
