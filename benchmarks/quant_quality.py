"""Int8 weight-only quality and CPU speed vs full precision, both through our engine.

On a real trained model, SmolLM2-135M-Instruct (scripts/real_model.py: imported from its
Q4_1 GGUF into float32), and held-out text it cannot have seen: this repository's own
docs (README.md and docs/*.md, written after the model was trained):

- perplexity over sliding windows (int8 vs full precision, target: within 2%);
- greedy-token agreement over 1,000 generated tokens from several held-out
  prompts (target: at least 90%), counted two ways: free-running (both engines
  generate with LLM.generate; position by position, so one early flip costs
  the rest of that stream) and teacher-forced (int8's argmax at every position
  of full precision's own greedy continuation);
- weight bytes of the loaded models, whole and linear-only;
- CPU decode time per token at batch 1 (target: int8 no slower than 1.2x).

Perplexity and teacher-forced agreement run whole windows as one prefill (many
rows: int8 dequantizes for MKL's fp32 matmul); free-running generation decodes one
row at a time, through kernels/cpu/int8_matmul.c, which keeps activations in fp32
(torch's own int8 GEMV, the fallback without a C compiler, rounds them to bf16 and
agreed on 82% here). Decode speed is timed at each of --speed-threads:
on a CPU whose cores are busy with other work, torch's int8 GEMV slowed down
far more with 2 threads than fp32's small GEMVs did (a parallel region waits
for its slowest thread), so the thread count matters to the ratio.
The report, with the machine's details, is also written to
benchmarks/results/quant_quality.txt.

    .venv/bin/python benchmarks/quant_quality.py [--model DIR] [--heldout FILE] [--threads 2]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rounds import medians, shown  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def add_quality_args(p: argparse.ArgumentParser) -> None:
    """The model, the held-out text, perplexity's windows and the greedy prompts (shared
    with benchmarks/kv_cache_dtype.py)."""
    p.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--heldout", default=None, help="text file (default: this repository's docs)")
    p.add_argument("--ppl-tokens", type=int, default=4096)
    p.add_argument("--window", type=int, default=256, help="<= max_position_embeddings")
    p.add_argument("--stride", type=int, default=128)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=1000, help="in total, over all prompts")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quality_args(p)
    p.add_argument("--dtype", default="float32", help="full-precision engine dtype")
    p.add_argument("--speed-tokens", type=int, default=64)
    p.add_argument("--speed-repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--speed-threads", default="1,2", help="torch thread counts to time decode at")
    return p.parse_args(argv)


def held_out_docs() -> str:
    """README.md and docs/*.md: English technical prose from after the model's training."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(f.read_text() for f in files)


def perplexity(engine, ids: list[int], window: int, stride: int) -> float:
    """exp(mean NLL); every token after the first is scored once, with up to window-1 of
    context, except a window's first token when stride == window (nothing before it in
    its window predicts it)."""
    import torch

    nll, count, done = 0.0, 0, 1          # done: tokens [0, done) are scored or passed over
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + window, len(ids))
        first = max(done, begin + 1)      # token `begin` has no row before it in this window
        logp = torch.log_softmax(engine.runner.prompt_logits(ids[begin:end]), dim=-1)
        rows = torch.arange(first - begin - 1, end - begin - 1)    # row r predicts token begin+r+1
        nll -= logp[rows, torch.tensor(ids[first:end])].sum().item()
        count, done = count + end - first, end
        if end == len(ids):
            break
    return math.exp(nll / count)


def perplexities(llms: dict, ids: list[int], args) -> dict[str, float]:
    """Each engine's perplexity over the first --ppl-tokens of ids, --window and --stride."""
    return {name: perplexity(llm.engine, ids[:args.ppl_tokens], args.window, args.stride)
            for name, llm in llms.items()}


def held_out_prompts(ids: list[int], count: int, length: int) -> list[list[int]]:
    """`count` prompts spread evenly over the held-out tokens."""
    step = (len(ids) - length) // count
    return [ids[i * step: i * step + length] for i in range(count)]


def generate(llm, prompts, n: int) -> list[list[int]]:
    from runtime import SamplingParams

    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def free_running_agreement(full: list[list[int]], int8: list[list[int]]) -> float:
    pairs = [(a, b) for x, y in zip(full, int8) for a, b in zip(x, y)]
    return sum(a == b for a, b in pairs) / len(pairs)


def teacher_forced_agreement(engine, prompts, continuations) -> float:
    """Share of positions where int8's argmax equals full precision's greedy token."""
    hits = total = 0
    for prompt, cont in zip(prompts, continuations):
        logits = engine.runner.prompt_logits(prompt + cont)
        guess = logits[len(prompt) - 1: len(prompt) + len(cont) - 1].argmax(dim=-1).tolist()
        hits += sum(g == t for g, t in zip(guess, cont))
        total += len(cont)
    return hits / total


def greedy_agreement(full, other, ids: list[int], args) -> tuple[float, float]:
    """`other`'s free-running and teacher-forced agreement with `full`'s greedy tokens after
    --prompts held-out prompts, --gen-tokens in all."""
    prompts = held_out_prompts(ids, args.prompts, args.prompt_len)
    outs = [generate(llm, prompts, args.gen_tokens // args.prompts) for llm in (full, other)]
    return free_running_agreement(*outs), teacher_forced_agreement(other.engine, prompts, outs[0])


def decode_s_per_token(llm, prompt: list[int], n: int) -> float:
    """Batch-1 decode seconds per token, from the engine's own per-request metrics."""
    from runtime import SamplingParams

    (out,) = llm.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return out.metrics.decode_s / (len(out.token_ids) - 1)


def speed(llms: dict, prompt: list[int], args) -> dict[str, list[float]]:
    """Per-token decode times of each repeat, the engines alternating so load drift hits both."""
    for llm in llms.values():
        decode_s_per_token(llm, prompt, 8)                         # warm-up
    times: dict[str, list[float]] = {name: [] for name in llms}
    for _ in range(args.speed_repeats):
        for name, llm in llms.items():
            times[name].append(decode_s_per_token(llm, prompt, args.speed_tokens))
    return times


def mib(n: int) -> str:
    return f"{n / 2 ** 20:.2f} MiB"


def report_memory(llms: dict) -> None:
    full, int8 = (llms[k].engine.weight_memory for k in ("full", "int8"))
    print(f"weights, whole model:  full {mib(full.total_bytes)}  int8 {mib(int8.total_bytes)}  "
          f"({full.total_bytes / int8.total_bytes:.2f}x smaller)")
    print(f"weights, linears only: full {mib(full.linear_bytes)}  int8 {mib(int8.linear_bytes)}  "
          f"({full.linear_bytes / int8.linear_bytes:.2f}x smaller)")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from runtime import LLM
    from scripts.real_model import smollm2_dir

    torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else smollm2_dir()
    if not (model / "model.safetensors").is_file() and not any(model.glob("*.safetensors")):
        sys.exit(f"{model}: no safetensors weights")
    kv = max(args.window, args.prompt_len + args.gen_tokens) + 64
    llms = {name: LLM(str(model), dtype=args.dtype, quantization=q, kv_cache_tokens=kv,
                      enable_prefix_caching=False)
            for name, q in (("full", None), ("int8", "int8"))}
    text = Path(args.heldout).read_text() if args.heldout else held_out_docs()
    ids = llms["full"].tokenizer.encode(text)
    print(f"model {model} (checkpoint {llms['full'].engine.model_config.dtype}), full precision = "
          f"{args.dtype}, torch threads {args.threads}, {len(ids)} held-out tokens")
    report_memory(llms)

    ppl_ids = ids[:args.ppl_tokens]
    ppl = perplexities(llms, ids, args)
    ppl_gap = ppl["int8"] / ppl["full"] - 1
    print(f"perplexity ({len(ppl_ids)} tokens, window {args.window}, stride {args.stride}): "
          f"full {ppl['full']:.3f}  int8 {ppl['int8']:.3f}  ({ppl_gap:+.3%}; target within 2%: "
          f"{verdict(abs(ppl_gap) <= 0.02)})")

    prompts = held_out_prompts(ids, args.prompts, args.prompt_len)
    per_prompt = args.gen_tokens // args.prompts
    free, forced = greedy_agreement(llms["full"], llms["int8"], ids, args)
    n_tokens = per_prompt * len(prompts)
    print(f"greedy agreement over {n_tokens} tokens ({len(prompts)} prompts x {per_prompt}): "
          f"free-running {free:.1%}, teacher-forced {forced:.1%} (target >= 90%: "
          f"free-running {verdict(free >= 0.9)}, teacher-forced {verdict(forced >= 0.9)})")

    for threads in (int(n) for n in args.speed_threads.split(",")):
        torch.set_num_threads(threads)
        report_speed(speed(llms, prompts[0], args), args, threads)


def report_speed(times: dict[str, list[float]], args, threads: int) -> None:
    mid = medians(times)
    ratio = mid["int8"] / mid["full"]
    print(f"CPU decode, {threads} thread(s), batch 1, {args.speed_tokens} tokens x {args.speed_repeats} repeats: "
          f"median full {mid['full'] * 1e3:.2f} int8 {mid['int8'] * 1e3:.2f} ms/token "
          f"(int8/full {ratio:.2f}x; target <= 1.2x: {verdict(ratio <= 1.2)})")
    for name, values in times.items():
        print(f"  {name} ms/token: {shown(values, 1e3, 2)}")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
