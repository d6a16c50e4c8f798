"""Tensor parallelism, 2 ranks vs 1, both through our engine in the same run.

- weight bytes each rank holds, as a fraction of one rank holding the whole model
  (target: about half);
- greedy agreement, token for token, over --prompts x --tokens generated tokens
  (target: all of them, in float32);
- decode throughput at batch --batch: 2 ranks of --threads each vs 1 rank of
  --threads, and vs 1 rank of 2 x --threads (the same cores). On a 2-core CPU the
  collectives (gloo over loopback, two all-reduces per layer) cost more than the
  halved matmuls save; the point here is memory and exactness. Speed is for NCCL
  on GPUs, which this machine does not have.

The default model is a random Llama of the trained demo model's former shape (hidden
256, 4 layers, 8 heads / 2 KV heads: both split in two), made in a temp dir; the real
SmolLM2-135M has 9 heads and 3 KV heads, which two ranks cannot split. Prompts are
this repository's docs, tokenized.
The report, with the machine's details, is also written to
benchmarks/results/tensor_parallel.txt.

    .venv/bin/python benchmarks/tensor_parallel.py [--model DIR]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
BENCH_SPEC = dict(arch="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=4096,
                  max_position_embeddings=1024)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a model folder (default: a random one, see above)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64, help="generated per prompt")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    return p.parse_args(argv)


def prompts(model: str, n: int) -> list[list[int]]:
    from runtime.core.tokenizer import Tokenizer

    text = "\n\n".join(f.read_text() for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    ids = Tokenizer(model, ()).encode(text)
    return [ids[i * 97:i * 97 + 24] for i in range(n)]


def run(model: str, tp: int, threads: int, batch: list[list[int]], tokens: int):
    """(generated ids, weight bytes per rank, decode tokens per second)."""
    import os

    import torch

    from runtime import LLM, SamplingParams

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)        # the spawned ranks read it at start
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    with LLM(model, kv_cache_tokens=8192, tensor_parallel_size=tp, enable_prefix_caching=False) as llm:
        llm.generate(batch[:1], SamplingParams(temperature=0.0, max_tokens=4))      # warm up
        started = time.perf_counter()
        outs = llm.generate(batch, params)
        elapsed = time.perf_counter() - started
        memory = [w.total_bytes for w in llm.engine.rank_weight_memory]
    return [o.token_ids for o in outs], memory, len(batch) * tokens / elapsed


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.model is None:
        import tempfile

        from tests.support.model_factory import make_model

        args.model = str(make_model(Path(tempfile.mkdtemp(prefix="thawpool-tp-")) / "llama", **BENCH_SPEC))
    batch = prompts(args.model, args.prompts)[:args.batch]
    one, (whole,), one_tps = run(args.model, 1, args.threads, batch, args.tokens)
    two, ranks, two_tps = run(args.model, 2, args.threads, batch, args.tokens)
    _, _, wide_tps = run(args.model, 1, 2 * args.threads, batch, args.tokens)
    same = sum(a == b for x, y in zip(one, two) for a, b in zip(x, y))
    total = sum(len(x) for x in one)
    print(f"model {args.model}: {whole / 1e6:.2f} MB of weights on one rank")
    for rank, nbytes in enumerate(ranks):
        print(f"  rank {rank} of 2 holds {nbytes / 1e6:.2f} MB = {nbytes / whole:.3f}x one rank")
    print(f"greedy agreement, 2 ranks vs 1: {same}/{total} tokens ({100 * same / total:.1f}%)")
    print(f"decode at batch {len(batch)}: 2 ranks x {args.threads} thread(s) {two_tps:.0f} tok/s = "
          f"{two_tps / one_tps:.2f}x 1 rank x {args.threads}, "
          f"{two_tps / wide_tps:.2f}x 1 rank x {2 * args.threads}")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
