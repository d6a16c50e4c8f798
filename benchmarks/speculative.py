"""Speculative decoding (n-gram prompt lookup) vs none, at batch 1 and batch 32, one run.

By default on a real model, SmolLM2-135M-Instruct (scripts/real_model.py), asked what
people ask that copies from the prompt: code edits on functions of this repository
("add a docstring", "add type hints": the answer repeats the function) and summaries of
its docs that quote a sentence word for word. Greedy; each answer ends where the model
ends it (EOS) or at the length cap.

--synthetic: a copy-heavy workload built for the purpose ("edit this text": the output
repeats spans of the prompt). A model
with random weights does not copy on its own, so the benchmark model is constructed to:
its attention output projections are zeroed (attention is still computed in full, so
every step costs what it would), which makes greedy decoding a fixed map token -> next
token whose trajectories end in cycles. Each prompt is such a trajectory (a "document"
of --prompt-len tokens), and its continuation walks the same cycle again: copying.
Greedy, ignore_eos; outputs are checked equal with and without speculation, and the
acceptance rate printed says how copy-heavy the run was. Ratios are given per wall
second and per CPU second of this process (the latter is robust to a busy machine).
Targets: >= 1.5x output tok/s at batch 1; >= 0.95x at batch 32 (backoff turns it off).

Read the synthetic batch-1 speedup as a ceiling, not a typical figure: the model is built to loop,
so n-gram lookup guesses right far more often than a trained model on ordinary text
would let it (the acceptance rate printed is the measure); random weights, fp32, CPU.
The report, with the machine's details, is also written to benchmarks/results/speculative.txt.

    .venv/bin/python benchmarks/speculative.py                      # the real model
    .venv/bin/python benchmarks/speculative.py --synthetic          # ~30 s on 2 quiet CPU cores
    .venv/bin/python benchmarks/speculative.py --synthetic --batch1-requests 1 --output-len 48 --batch-output-len 16
"""
from __future__ import annotations

import argparse
import ast
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


ROOT = Path(__file__).resolve().parents[1]
CODE_FILES = ["pool/placement.py", "pool/autoscaler.py", "pool/backoff.py", "runtime/engine/sampler.py",
              "runtime/spec_decode/rejection_sampler.py", "wire/sse.py", "controlplane/billing/pricing.py",
              "kernels/rotary.py"]
EDITS = ["Add a docstring to this Python function. Reply with the whole function.",
         "Add type hints to this Python function. Reply with the whole function."]
QUOTE = "Summarize this text in two sentences, then quote its most important sentence word for word."


def functions(lines: tuple[int, int] = (6, 24)) -> list[str]:
    """Top-level functions of this repository, `lines` long, in a fixed order."""
    found = []
    for name in CODE_FILES:
        source = (ROOT / name).read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and lines[0] <= node.end_lineno - node.lineno + 1 <= lines[1]:
                found.append(ast.get_source_segment(source, node))
    return found


def paragraphs(chars: tuple[int, int] = (300, 900)) -> list[str]:
    """Prose paragraphs of the README and docs/."""
    text = "\n\n".join(f.read_text() for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    return [p.strip() for p in text.split("\n\n")
            if chars[0] <= len(p.strip()) <= chars[1] and p.strip()[0].isalpha() and "|" not in p]


def real_prompts(tokenizer, n: int, offset: int = 0) -> list[list[int]]:
    """n chat requests whose answers copy from the prompt: code edits and quoting summaries, alternating."""
    code, prose = functions(), paragraphs()
    tasks = []
    for i in range(offset, offset + n):
        if i % 2 == 0:
            tasks.append(f"{EDITS[i // 2 % 2]}\n\n```python\n{code[i // 2 % len(code)]}\n```")
        else:
            tasks.append(f"{QUOTE}\n\n{prose[i // 2 % len(prose)]}")
    return [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in tasks]


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
    ap.add_argument("--synthetic", action="store_true", help="the constructed copying model (see above)")
    ap.add_argument("--batch1-requests", type=int, default=None, help="default: 6 real, 3 synthetic")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=None, help="default: 192 real, 96 synthetic")
    ap.add_argument("--batch-output-len", type=int, default=None, help="default: 128 real, 32 synthetic")
    ap.add_argument("--prompt-len", type=int, default=256, help="synthetic prompts")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a folder made by a previous run")
    args = ap.parse_args()
    real = not args.synthetic
    batch1 = args.batch1_requests or (6 if real else 3)
    out_len = args.output_len or (192 if real else 96)
    batch_out_len = args.batch_output_len or (128 if real else 32)

    import torch
    torch.set_num_threads(args.threads)
    from runtime import LLM, SamplingParams
    from scripts.real_model import smollm2_dir
    if real:
        model_dir = args.model_dir or smollm2_dir()
    else:
        model_dir = args.model_dir or Path(tempfile.mkdtemp(prefix="thawpool-spec-")) / "llama"
        if not (model_dir / "config.json").is_file():
            make_copying_model(model_dir)
    spec = {"method": "ngram", "k": args.k, "n": args.n}
    engines = {"off": LLM(str(model_dir), kv_cache_tokens=65536, enable_prefix_caching=False),
               "ngram": LLM(str(model_dir), kv_cache_tokens=65536, enable_prefix_caching=False,
                            speculative=spec)}
    for llm in engines.values():                                   # warm-up
        llm.generate([[5, 6, 7] * 4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    if real:
        tok = engines["off"].tokenizer
        first, many = real_prompts(tok, batch1), real_prompts(tok, args.batch, offset=batch1)
        print(f"model {model_dir} (SmolLM2-135M-Instruct), chat requests that copy: code edits on "
              f"{len(functions())} functions of this repo, quoting summaries of {len(paragraphs())} doc "
              f"paragraphs; speculative={spec}, {args.threads} threads")
    else:
        step = next_token_map(engines["off"])
        first = make_prompts(step, batch1, args.prompt_len, args.seed)
        many = make_prompts(step, args.batch, args.prompt_len, args.seed + 1)
        print(f"model {model_dir} ({BENCH_SPEC['num_hidden_layers']} layers, hidden {BENCH_SPEC['hidden_size']}, "
              f"attention output zeroed), {args.prompt_len}-token prompts, speculative={spec}, "
              f"{args.threads} threads")
    cases = [("batch 1", first, out_len, False), (f"batch {args.batch}", many, batch_out_len, True)]
    for name, prompts, n_out, concurrent in cases:
        params = SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=not real)
        before = engines["ngram"].engine.stats()
        off, off_cpu, want = run(engines["off"], prompts, params, concurrent)
        on, on_cpu, got = run(engines["ngram"], prompts, params, concurrent)
        after = engines["ngram"].engine.stats()
        proposed = after.spec_proposed - before.spec_proposed
        accepted = after.spec_accepted - before.spec_accepted
        rate = f"{accepted / proposed:.2f}" if proposed else "n/a (backed off)"
        mean_len = sum(map(len, want)) / len(want)
        print(f"{name:9s}: off {off:7.1f} tok/s | ngram {on:7.1f} tok/s | ratio {on / off:.2f}x wall, "
              f"{on_cpu / off_cpu:.2f}x per CPU-second | acceptance {rate} ({accepted}/{proposed}) | "
              f"{len(prompts)} requests, {mean_len:.0f} tokens each on average | outputs identical: {got == want}")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
