"""Perplexity of a GGUF served as it is stored: thawpool (its weights kept 4-bit) against
llama.cpp's own `llama-perplexity` on the same file, the same text, the same windows.

The model is SmolLM2-135M-Instruct from its Q4_1 file (scripts/real_model.py); the text is
this repository's docs (README.md and docs/*.md, written after the model was trained).
Both score it the way llama-perplexity does: the tokens cut into chunks of --ctx, each
chunk run on its own (its first token the BOS when the vocabulary adds one), and only the
second half of each chunk scored, every token predicted by the row before it. Target:
within 0.5% of each other (the issue's bar; thawpool's 4-bit values are bit for bit the
file's, what differs is arithmetic: llama.cpp rounds activations to 8 bits for its Q4_1
dot products, thawpool keeps them in float32). The report is also written to
benchmarks/results/gguf_perplexity.txt.

    .venv/bin/python benchmarks/gguf_perplexity.py [--ctx 512] [--chunks 16] [--threads 2]
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers import ensure_llama_server  # noqa: E402
from benchmarks.quant_quality import held_out_docs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CACHE = ROOT / ".cache" / "llama-cpp"
TARGET = 0.005


def chunks(ids: list[int], ctx: int, count: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: consecutive --ctx tokens, the first replaced by BOS."""
    out = []
    for i in range(min(count, len(ids) // ctx)):
        chunk = ids[i * ctx:(i + 1) * ctx]
        out.append(chunk if bos is None else [bos] + chunk[1:])
    return out


def thawpool_perplexity(model_dir: Path, ids: list[int], args: argparse.Namespace, low_precision: bool) -> float:
    import torch

    from runtime import LLM

    llm = LLM(str(model_dir), kv_cache_tokens=args.ctx + 64, cpu_low_precision=low_precision)
    bos = args.bos_id if args.add_bos else None
    first = args.ctx // 2
    nll, count = 0.0, 0
    for chunk in chunks(ids, args.ctx, args.chunks, bos):
        logp = torch.log_softmax(llm.engine.runner.prompt_logits(chunk).double(), dim=-1)
        rows = torch.arange(first, args.ctx - 1)             # row r predicts token r + 1
        nll -= logp[rows, torch.tensor(chunk[first + 1:])].sum().item()
        count += len(rows)
    return math.exp(nll / count)


def llama_perplexity(gguf: Path, text: str, args: argparse.Namespace) -> float:
    server = ensure_llama_server(LLAMA_CACHE, build=True)
    assert server is not None
    binary = server.parent / "llama-perplexity"
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(text)
        f.flush()
        run = subprocess.run([str(binary), "-m", str(gguf), "-f", f.name, "-c", str(args.ctx),
                              "--chunks", str(args.chunks), "-t", str(args.threads), "-b", str(args.ctx)],
                             capture_output=True, text=True, env={"LD_LIBRARY_PATH": str(binary.parent)})
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"llama-perplexity failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> None:
    from runtime.core.tokenizer import Tokenizer
    from scripts.real_model import smollm2_dir, smollm2_gguf

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import torch

    from runtime.gguf.importer import read_file_header

    torch.set_num_threads(args.threads)
    gguf, folder = smollm2_gguf(), smollm2_dir(quantized=True)
    meta = read_file_header(gguf).metadata          # what llama-perplexity goes by
    args.add_bos, args.bos_id = bool(meta.get("tokenizer.ggml.add_bos_token", False)), \
        meta.get("tokenizer.ggml.bos_token_id")
    text = held_out_docs()
    ids = Tokenizer(folder).encode(text)
    print(f"model: {gguf.name} (thawpool: {folder.name}, weights kept quantized)")
    print(f"text: README.md + docs/*.md, {len(ids)} tokens; {args.chunks} chunks of {args.ctx}, "
          f"second halves scored; BOS first: {args.add_bos}")
    theirs = llama_perplexity(gguf, text, args)
    print(f"llama-perplexity on {gguf.name}: {theirs:.4f}")
    for low_precision in (False, True):
        ours = thawpool_perplexity(folder, ids, args, low_precision)
        gap = abs(ours / theirs - 1)
        verdict = "met" if gap <= TARGET else "NOT met"
        kernels = "W4A8 (cpu_low_precision)" if low_precision else "W4A16"
        print(f"thawpool {kernels}: {ours:.4f}, ratio {ours / theirs:.4f} "
              f"(|gap| {gap:.2%}, target <= {TARGET:.1%}: {verdict})")
    exported = LLAMA_CACHE / "SmolLM2-135M-Instruct.f32.gguf"
    if exported.is_file():       # the same values dequantized: llama.cpp without 8-bit activations
        print(f"llama-perplexity on {exported.name} (Q4_1's values as float32, benchmarks/peers.py's "
              f"export): {llama_perplexity(exported, text, args):.4f}")


if __name__ == "__main__":
    from benchmarks.results import recorded

    with recorded(__file__):
        main()
