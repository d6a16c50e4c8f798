"""Train the tiny demo Llama that `make demo` serves and the int8 benchmark uses.

Everything comes from text that ships with Python: the standard library's own
sources (*.py) and the docs in `pydoc_data/topics.py`. No downloads.

    .venv/bin/python scripts/train_demo_model.py --out models/demo [--minutes 12]

Steps: pick files (sorted, deterministic), hold some out (written to
`heldout.txt`), train a byte-level BPE tokenizer, train a small
LlamaForCausalLM from scratch on the CPU for a wall-clock budget (or a fixed
`--steps`), save it in bfloat16 and report held-out perplexity.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import math
import os
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
os.environ.setdefault("RAYON_NUM_THREADS", "2")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

SEED = 1234
SEQ_LEN = 256

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD, IM_START, IM_END]  # ids 0..5

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Parts of the standard library left out: tests, vendored tools, and the
# codec tables in encodings/ (mostly hex literals).
EXCLUDED_DIRS = {
    "site-packages", "test", "tests", "idle_test", "idlelib", "lib2to3",
    "encodings", "ensurepip", "turtledemo", "pydoc_data", "__pycache__",
    "config-3.11-x86_64-linux-gnu",
}
HELDOUT_EVERY = 23          # every 23rd file (by sorted path) is a held-out candidate
HELDOUT_CODE_BYTES = 70_000
HELDOUT_TOPIC_EVERY = 20    # every 20th pydoc topic is held out
HELDOUT_TOPIC_BYTES = 15_000
SYSTEM_PROMPT = "You are a helpful assistant that knows the Python standard library."


# ---------------------------------------------------------------- corpus

@dataclass
class Corpus:
    train_docs: list[str]     # plain text documents (code and docs)
    chat_docs: list[str]      # conversations rendered with CHAT_TEMPLATE
    heldout_text: str
    heldout_files: list[str]


def stdlib_files(stdlib: Path) -> list[Path]:
    files = []
    for path in stdlib.rglob("*.py"):
        rel = path.relative_to(stdlib)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def pydoc_topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics
    return sorted(topics.items())


def split_heldout(stdlib: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Return (train, heldout) lists of (relative path, text), deterministic."""
    train, heldout, held_bytes = [], [], 0
    for i, path in enumerate(stdlib_files(stdlib)):
        text = read_text(path)
        if not text or not text.strip():
            continue
        rel = path.relative_to(stdlib).as_posix()
        candidate = i % HELDOUT_EVERY == HELDOUT_EVERY // 2 and 1_000 <= len(text) <= 20_000
        if candidate and held_bytes < HELDOUT_CODE_BYTES:
            heldout.append((rel, text))
            held_bytes += len(text)
        else:
            train.append((rel, text))
    return train, heldout


def module_name(rel: str) -> str:
    name = rel[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def first_paragraph(doc: str, limit: int = 600) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0].strip()
    if len(para) > limit:
        para = para[:limit].rsplit(" ", 1)[0] + " ..."
    return para


def render_chat(messages: list[dict]) -> str:
    import jinja2
    return jinja2.Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=False)


def docstring_chats(rel: str, text: str, rng: random.Random) -> list[list[dict]]:
    """Question/answer pairs built from the docstrings of one module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    mod = module_name(rel)
    pairs = []
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= 40:
        pairs.append((f"What is the {mod} module for?", first_paragraph(doc)))
    nodes = [(n, n.name) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            nodes += [(m, f"{node.name}.{m.name}") for m in node.body if isinstance(m, ast.FunctionDef)]
    questions = [
        "What does {q} in the {m} module do?",
        "Explain {m}.{q}.",
        "How do I use {q} from {m}?",
        "Describe {m}.{q} briefly.",
    ]
    for node, qual in nodes:
        if any(part.startswith("_") for part in qual.split(".")):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 40:
            continue
        question = rng.choice(questions).format(q=qual, m=mod)
        pairs.append((question, first_paragraph(doc)))
    chats = []
    for question, answer in pairs:
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        chats.append(messages)
    return chats


def topic_chat(name: str, text: str, rng: random.Random) -> list[dict]:
    question = rng.choice([
        "Tell me about {t} in Python.",
        "Explain the '{t}' topic from the Python documentation.",
        "What is {t}?",
    ]).format(t=name)
    answer = text.strip()
    if len(answer) > 800:
        answer = answer[:800].rsplit("\n\n", 1)[0].strip()
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def build_corpus() -> Corpus:
    rng = random.Random(SEED)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train_files, held_files = split_heldout(stdlib)

    train_docs = [text for _, text in train_files]
    chats = []
    for rel, text in train_files:
        chats += docstring_chats(rel, text, rng)

    held_topics, held_topic_bytes = [], 0
    for i, (name, text) in enumerate(pydoc_topics()):
        if i % HELDOUT_TOPIC_EVERY == HELDOUT_TOPIC_EVERY // 2 and held_topic_bytes < HELDOUT_TOPIC_BYTES:
            held_topics.append((name, text))
            held_topic_bytes += len(text)
            continue
        train_docs.append(text)
        chats.append(topic_chat(name, text, rng))

    heldout_parts = [text for _, text in held_files] + [text for _, text in held_topics]
    heldout_names = [rel for rel, _ in held_files] + [f"pydoc_data/topics.py:{n}" for n, _ in held_topics]
    return Corpus(
        train_docs=train_docs,
        chat_docs=[render_chat(m) for m in chats],
        heldout_text="\n\n".join(p.strip("\n") for p in heldout_parts) + "\n",
        heldout_files=heldout_names,
    )


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(docs: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "additional_special_tokens": [IM_START, IM_END],
        "added_tokens_decoder": added,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD,
                   "additional_special_tokens": [IM_START, IM_END]}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


def encode_stream(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """All documents as one token stream, each wrapped in <s> ... </s>."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


# ---------------------------------------------------------------- model

def make_config(vocab_size: int, args: argparse.Namespace) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        initializer_range=0.02,
        hidden_act="silu",
    )


def sample_batch(stream: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (batch,), generator=gen)
    return torch.stack([stream[s: s + SEQ_LEN] for s in starts.tolist()]).long()  # [B, S]


def lr_at(progress: float, step: int, peak: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine from peak to peak/10."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, ids: list[int], window: int = SEQ_LEN) -> float:
    """Mean next-token NLL over non-overlapping windows, as perplexity (fp32)."""
    model.eval()
    nll, count = 0.0, 0
    chunks = [ids[i: i + window] for i in range(0, len(ids), window)]
    chunks = [c for c in chunks if len(c) > 1]
    for chunk in chunks:
        x = torch.tensor([chunk])  # [1, S]
        logits = model(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum")
        nll += loss.item()
        count += len(chunk) - 1
    return math.exp(nll / count)


@torch.no_grad()
def greedy(model: LlamaForCausalLM, tok: Tokenizer, prompt: str, max_new: int = 60) -> str:
    model.eval()
    ids = tok.encode(prompt, add_special_tokens=False).ids
    stop = {tok.token_to_id(EOS), tok.token_to_id(IM_END)}
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                         eos_token_id=list(stop), pad_token_id=tok.token_to_id(PAD))
    return tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=False)


def train(model, stream, args) -> tuple[int, float, float]:
    """AdamW with a cosine schedule over `--steps` steps, or else over the
    `--minutes` wall-clock budget (progress = elapsed / budget), so the run
    ends on time however busy the machine is. The step count reached is
    reported; rerun with `--steps N` to repeat a run step for step."""
    gen = torch.Generator().manual_seed(SEED)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    budget_s = args.minutes * 60
    model.train()
    t0 = time.time()
    step, smooth = 0, None
    while True:
        elapsed = time.time() - t0
        progress = step / args.steps if args.steps else elapsed / budget_s
        if progress >= 1.0:
            break
        lr = lr_at(progress, step, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        x = sample_batch(stream, args.batch, gen)  # [B, S]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = loss.item()
        smooth = loss if smooth is None else 0.95 * smooth + 0.05 * loss
        if step % 25 == 0:
            done_s = time.time() - t0
            print(f"step {step:5d}  loss {loss:.3f}  smooth {smooth:.3f}  lr {lr:.2e}  "
                  f"{done_s:6.0f}s  {(step + 1) * x.numel() / done_s:5.0f} tok/s", flush=True)
        step += 1
    elapsed = time.time() - t0
    print(f"step {step:5d}  smooth loss {smooth:.3f}  {elapsed:6.0f}s (done)", flush=True)
    return step, smooth, elapsed


# ---------------------------------------------------------------- main

def finish_config(out: Path, dtype: str) -> None:
    """Add the keys older (v4) readers look for next to the v5 ones."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = dtype
    cfg["dtype"] = dtype
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("models/demo"))
    p.add_argument("--minutes", type=float, default=14.0, help="training wall-clock budget")
    p.add_argument("--steps", type=int, default=None, help="fixed step count (overrides --minutes)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--resume", action="store_true",
                   help="continue training the model already in --out, with its tokenizer")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(SEED)
    torch.manual_seed(SEED)
    args.out.mkdir(parents=True, exist_ok=True)

    t_start = time.time()
    corpus = build_corpus()
    (args.out / "heldout.txt").write_text(corpus.heldout_text, encoding="utf-8")
    print(f"corpus: {len(corpus.train_docs)} docs ({sum(map(len, corpus.train_docs)) / 1e6:.1f} MB), "
          f"{len(corpus.chat_docs)} chats ({sum(map(len, corpus.chat_docs)) / 1e6:.1f} MB), "
          f"heldout {len(corpus.heldout_text) / 1e3:.0f} KB from {len(corpus.heldout_files)} files",
          flush=True)

    all_docs = corpus.train_docs + corpus.chat_docs
    if args.resume:
        tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    else:
        tok = train_tokenizer(all_docs, args.vocab)
        save_tokenizer(tok, args.out)
    stream = encode_stream(tok, all_docs)
    held_ids = tok.encode(corpus.heldout_text, add_special_tokens=False).ids
    print(f"tokenizer: vocab {tok.get_vocab_size()}, train stream {len(stream) / 1e6:.2f}M tokens, "
          f"heldout {len(held_ids)} tokens ({len(corpus.heldout_text) / len(held_ids):.2f} chars/token), "
          f"{time.time() - t_start:.0f}s", flush=True)

    config = make_config(tok.get_vocab_size(), args)
    model = LlamaForCausalLM(config)
    if args.resume:  # continue from the weights in --out (optimizer state starts fresh)
        model = LlamaForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M params", flush=True)
    random_ppl = perplexity(LlamaForCausalLM(config), held_ids[:8192])
    print(f"random-init heldout ppl (first 8192 tokens): {random_ppl:.1f}", flush=True)

    steps, final_loss, train_s = train(model, stream, args)
    print(f"trained {steps} steps in {train_s / 60:.1f} min, final smoothed loss {final_loss:.3f}", flush=True)

    model.config.dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(args.out)
    finish_config(args.out, "bfloat16")
    model.generation_config.eos_token_id = [tok.token_to_id(EOS), tok.token_to_id(IM_END)]
    model.generation_config.bos_token_id = tok.token_to_id(BOS)
    model.generation_config.pad_token_id = tok.token_to_id(PAD)
    model.generation_config.save_pretrained(args.out)

    # Evaluate what was saved: bf16 weights loaded back in fp32.
    saved = LlamaForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    ppl_8k = perplexity(saved, held_ids[:8192])
    ppl_all = perplexity(saved, held_ids)
    print(f"heldout ppl (saved weights, fp32): first 8192 tokens {ppl_8k:.2f}, "
          f"all {len(held_ids)} tokens {ppl_all:.2f}", flush=True)
    for prompt in ["def ", "import os\n", "class Stack:\n    "]:
        print(f"--- greedy {prompt!r}\n{prompt}{greedy(saved, tok, prompt)}", flush=True)
    chat = jinja_chat(tok, "What does os.path.join do?")
    print(f"--- greedy chat\n{greedy(saved, tok, chat)}", flush=True)

    summary = {
        "params": n_params, "steps": steps, "resumed": args.resume, "lr": args.lr, "batch": args.batch,
        "seq_len": SEQ_LEN,
        "train_minutes": round(train_s / 60, 1), "final_train_loss": round(final_loss, 3),
        "heldout_ppl_8k": round(ppl_8k, 2), "heldout_ppl_all": round(ppl_all, 2),
        "heldout_tokens": len(held_ids), "random_init_ppl_8k": round(random_ppl, 1),
        "train_tokens": int(len(stream)), "python": sys.version.split()[0],
        "heldout_files": corpus.heldout_files,
    }
    (args.out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "heldout_files"}), flush=True)
    return 0


def jinja_chat(tok: Tokenizer, question: str) -> str:
    import jinja2
    return jinja2.Template(CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": question}], add_generation_prompt=True)


if __name__ == "__main__":
    sys.exit(main())
