"""Automatic prefix caching on vs off: a shared system prompt, and no sharing at all, one run.

Shared case: every request is the same system prompt (1,024 tokens) + a distinct question
(32 tokens), 32 output tokens, greedy, all submitted at once through the offline LLM API.
Unshared case: the same lengths with nothing in common, to show what caching costs when
it never hits. Each case runs on a fresh engine per setting (same model, same flags).
Targets: TTFT p50 >= 3x lower and throughput >= 2x higher with caching on (shared);
< 3% throughput lost with caching on (unshared). Throughput is also given per CPU second
of this process, which a busy machine disturbs much less than wall time.
Random weights, fp32, CPU, --threads torch threads. The report, with the machine's
details, is also written to benchmarks/results/prefix_cache.txt.

    .venv/bin/python benchmarks/prefix_cache.py                          # 200 requests, ~5 minutes
    .venv/bin/python benchmarks/prefix_cache.py --num-requests 96        # ~2-3 minutes on 2 quiet CPU cores
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

BENCH_SPEC = dict(arch="llama", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                  max_position_embeddings=2048)


def make_prompts(args, shared: bool) -> list[list[int]]:
    rng = random.Random(args.seed + shared)
    vocab = BENCH_SPEC["vocab_size"]

    def draw(n):
        return [rng.randrange(5, vocab) for _ in range(n)]

    system = draw(args.system_len)
    return [(system if shared else draw(args.system_len)) + draw(args.question_len)
            for _ in range(args.num_requests)]


def run(model_dir: Path, prompts, caching: bool, args) -> dict:
    from runtime import LLM, SamplingParams

    llm = LLM(str(model_dir), enable_prefix_caching=caching, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_tokens=args.max_num_seqs * (args.system_len + args.question_len + args.output_len + 16))
    llm.generate([[7] * 20], SamplingParams(max_tokens=2, temperature=0.0))          # warm-up
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    started, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    produced = sum(len(o.token_ids) for o in outs)
    return {"wall": wall, "cpu": cpu, "produced": produced, "ttfts": [o.metrics.ttft_s for o in outs],
            "cached": sum(o.num_cached_tokens for o in outs), "tokens": [o.token_ids for o in outs]}


def run_abba(model_dir: Path, prompts, args) -> dict[bool, dict]:
    """off, on, on, off: a load that drifts during the run hits both settings alike."""
    runs = {False: [], True: []}
    for caching in (False, True, True, False)[:4 if args.abba else 2]:
        runs[caching].append(run(model_dir, prompts, caching, args))
    return {caching: _merge(rs) for caching, rs in runs.items()}


def _merge(rs: list[dict]) -> dict:
    produced = sum(r["produced"] for r in rs)
    return {"tok_s": produced / sum(r["wall"] for r in rs), "tok_cpu_s": produced / sum(r["cpu"] for r in rs),
            "ttft_p50": statistics.median(t for r in rs for t in r["ttfts"]), "cached": rs[0]["cached"],
            "tokens": rs[0]["tokens"] if all(r["tokens"] == rs[0]["tokens"] for r in rs) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--system-len", type=int, default=1024)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-abba", dest="abba", action="store_false",
                    help="run each setting once (off, on) instead of off, on, on, off")
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a folder made by a previous run")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from tests.support.model_factory import make_model

    model_dir = args.model_dir or Path(tempfile.mkdtemp(prefix="thawpool-prefix-")) / "llama"
    if not (model_dir / "config.json").is_file():
        make_model(model_dir, **BENCH_SPEC)
    print(f"model {model_dir} | {args.num_requests} requests: {args.system_len} + {args.question_len} "
          f"prompt tokens, {args.output_len} output tokens, {args.threads} threads")
    for shared in (True, False):
        prompts = make_prompts(args, shared)
        both = run_abba(model_dir, prompts, args)
        off, on = both[False], both[True]
        name = "shared 1,024-token prefix" if shared else "0% shared prefix"
        print(f"{name}: caching off: TTFT p50 {off['ttft_p50']:.3f} s, {off['tok_s']:.1f} tok/s | "
              f"on: TTFT p50 {on['ttft_p50']:.3f} s, {on['tok_s']:.1f} tok/s, {on['cached']} cached tokens | "
              f"outputs identical: {on['tokens'] == off['tokens']}")
        print(f"  ratios: TTFT p50 {off['ttft_p50'] / on['ttft_p50']:.2f}x lower, "
              f"throughput {on['tok_s'] / off['tok_s']:.2f}x wall, "
              f"{on['tok_cpu_s'] / off['tok_cpu_s']:.2f}x per CPU-second (robust to a busy machine)")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
