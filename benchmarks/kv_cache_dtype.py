"""A bf16 KV cache (kv_cache_dtype="bfloat16") against the fp32 one, under the same fp32 model.

On a real trained model, SmolLM2-135M-Instruct (scripts/real_model.py), fp32 weights:

- perplexity over sliding windows of held-out text (this repository's docs, as
  benchmarks/quant_quality.py, whose helpers it reuses): the attention of every window
  reads k/v rounded to bf16, as decode does from the cache; relative difference printed;
- greedy agreement: free-running (both engines generate) and teacher-forced (the bf16
  engine's argmax along the fp32 engine's greedy continuation);
- the decode attention kernel alone (kernels/cpu/paged_attention.c), bf16 cache vs fp32
  cache, at SmolLM2's attention shape (9 query heads over 3 kv heads of 64), batch
  --batch, every sequence at --context tokens: time per call, the median of the repeats
  (each printed), the two alternating so load drift hits both;
- end-to-end decode: time per engine step of --batch sequences of --e2e-context tokens
  once all are prefilled (one token for each sequence per step), the two engines alternating,
  the median of --e2e-repeats.

The machine is shared: ratios of peers measured in the same run are the figures to read.
The report, with the machine's details, is also written to benchmarks/results/kv_cache_dtype.txt.

    .venv/bin/python benchmarks/kv_cache_dtype.py [--model DIR] [--batch 32] [--context 1024]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quant_quality import add_quality_args  # noqa: E402
from benchmarks.rounds import alternating_times, medians, shown  # noqa: E402

DTYPES = ("auto", "bfloat16")           # the fp32 cache (the model's dtype), then bf16


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quality_args(p)              # --model (fp32), --heldout, --ppl-tokens, --window, ...
    p.set_defaults(ppl_tokens=2048, prompts=4, gen_tokens=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", default="1024,2048", help="kernel timing contexts, comma-separated")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--e2e-context", type=int, default=512, help="0: skip the end-to-end timing")
    p.add_argument("--e2e-steps", type=int, default=4)
    p.add_argument("--e2e-repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


# ---- quality

def quality(model: Path, args: argparse.Namespace) -> None:
    from benchmarks.quant_quality import greedy_agreement, held_out_docs, perplexities
    from runtime import LLM

    kv = max(args.window, args.prompt_len + args.gen_tokens) + 64
    llms = {d: LLM(str(model), kv_cache_dtype=d, kv_cache_tokens=kv, enable_prefix_caching=False)
            for d in DTYPES}
    text = Path(args.heldout).read_text() if args.heldout else held_out_docs()
    ids = llms["auto"].tokenizer.encode(text)
    ppl = perplexities(llms, ids, args)
    print(f"perplexity ({len(ids[:args.ppl_tokens])} held-out tokens, window {args.window}, "
          f"stride {args.stride}): "
          f"fp32 KV {ppl['auto']:.4f}  bf16 KV {ppl['bfloat16']:.4f}  "
          f"(bf16/fp32 - 1 = {ppl['bfloat16'] / ppl['auto'] - 1:+.4%})")
    free, forced = greedy_agreement(llms["auto"], llms["bfloat16"], ids, args)
    per_prompt = args.gen_tokens // args.prompts
    print(f"greedy agreement over {per_prompt * args.prompts} tokens ({args.prompts} prompts x "
          f"{per_prompt}): free-running {free:.1%}, teacher-forced {forced:.1%}")


# ---- speed

def kernel_calls(batch: int, context: int, block_size: int = 16) -> dict[str, Callable[[], object]]:
    """The C decode attention at SmolLM2's shape over an fp32 and a bf16 copy of one cache,
    each sequence's blocks scattered over the cache as the block manager leaves them."""
    import torch

    from kernels.cpu.paged_attention import paged_decode_attention

    heads, kv_heads, dim = 9, 3, 64
    per_seq = -(-context // block_size)
    g = torch.Generator().manual_seed(0)
    tables = torch.randperm(batch * per_seq, generator=g).view(batch, per_seq).to(torch.int32)
    cache = torch.randn(2, batch * per_seq, block_size, kv_heads, dim, generator=g)
    q = torch.randn(batch, heads, dim, generator=g)
    lens = torch.full((batch,), context, dtype=torch.int32)
    def call(c: torch.Tensor) -> Callable[[], object]:
        return lambda: paged_decode_attention(q, c[0], c[1], tables, lens, dim ** -0.5)

    return {"auto": call(cache), "bfloat16": call(cache.to(torch.bfloat16))}


def kernel_speed(args: argparse.Namespace) -> None:
    for context in (int(c) for c in args.context.split(",")):
        times = alternating_times(kernel_calls(args.batch, context), args.repeats)
        mid = medians(times)
        mib = args.batch * context * 3 * 64 * 2 * 4 / 2 ** 20
        print(f"decode attention kernel, batch {args.batch}, context {context} (fp32 k+v "
              f"{mib:.0f} MiB per layer), median of {args.repeats}: fp32 KV {mid['auto'] * 1e3:.2f} ms, "
              f"bf16 KV {mid['bfloat16'] * 1e3:.2f} ms (fp32/bf16 = {mid['auto'] / mid['bfloat16']:.2f}x)")
        for dtype, values in times.items():
            print(f"  {dtype} KV ms: {shown(values, 1e3, 2)}")


def prefilled_engine(model: Path, kv_dtype: str, args: argparse.Namespace) -> Any:
    """An engine whose --batch sequences of --e2e-context prompt tokens are all prefilled."""
    from runtime import SamplingParams
    from runtime.engine.llm_engine import LLMEngine

    steps = (args.e2e_repeats + 1) * args.e2e_steps + 8
    engine = LLMEngine(str(model), kv_cache_dtype=kv_dtype, enable_prefix_caching=False,
                       kv_cache_tokens=args.batch * (args.e2e_context + steps + 16),
                       max_num_seqs=args.batch, max_num_batched_tokens=2048)
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(str(i), [(7 * i + 13 * t) % 40000 + 100 for t in range(args.e2e_context)], params)
    started: set[str] = set()
    while len(started) < args.batch:
        started |= {o.request_id for o in engine.step() if o.new_token_ids}
    return engine


def e2e_speed(model: Path, args: argparse.Namespace) -> None:
    engines = {d: prefilled_engine(model, d, args) for d in DTYPES}

    def steps(engine: Any) -> Callable[[], object]:
        return lambda: [engine.step() for _ in range(args.e2e_steps)]

    times = alternating_times({d: steps(e) for d, e in engines.items()}, args.e2e_repeats)
    per_step = {d: s / args.e2e_steps for d, s in medians(times).items()}
    print(f"end-to-end decode, batch {args.batch}, context ~{args.e2e_context}, {args.e2e_steps} steps "
          f"x median of {args.e2e_repeats}: fp32 KV {per_step['auto'] * 1e3:.1f} ms/step, bf16 KV "
          f"{per_step['bfloat16'] * 1e3:.1f} ms/step (throughput bf16/fp32 = "
          f"{per_step['auto'] / per_step['bfloat16']:.2f}x)")
    for dtype, values in times.items():
        print(f"  {dtype} KV ms/step: {shown([v / args.e2e_steps for v in values], 1e3, 1)}")


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    import torch

    from scripts.real_model import smollm2_dir

    torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else smollm2_dir()
    print(f"model {model}, fp32 weights, torch threads {args.threads}")
    quality(model, args)
    kernel_speed(args)
    if args.e2e_context:
        e2e_speed(model, args)


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
