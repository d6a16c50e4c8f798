"""The committed demo model (models/demo) is a trained Llama, not noise.

Made by scripts/train_demo_model.py; see models/demo/README.md.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import jinja2
import pytest

DEMO = Path(__file__).resolve().parent.parent / "models" / "demo"

# Measured when the model was trained: 169.1 (first 8192 held-out tokens,
# 256-token windows, bf16 weights run in fp32); random init gives about 4300.
# Bound = measured * 1.5. Retraining the model means updating this.
PPL_BOUND = 125.0
PPL_TOKENS = 8192
WINDOW = 256


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(DEMO / "tokenizer.json"))


def test_config_is_small_gqa_llama():
    cfg = json.loads((DEMO / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["tie_word_embeddings"] is False
    assert cfg["torch_dtype"] == "bfloat16"
    size = sum(p.stat().st_size for p in DEMO.iterdir() if p.is_file())
    assert size < 12 * 2**20


def test_tokenizer_round_trips_python(tokenizer):
    snippet = ('import os\n\ndef walk(top="."):\n    for root, dirs, files in os.walk(top):\n'
               '        yield root, len(files)  # ünïcode\n')
    ids = tokenizer.encode(snippet, add_special_tokens=False).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == snippet
    assert len(ids) < len(snippet) / 2  # BPE merges, not bytes


def test_chat_template_renders(tokenizer):
    cfg = json.loads((DEMO / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<s>" and cfg["eos_token"] == "</s>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is os.path?"}]
    text = jinja2.Template(cfg["chat_template"]).render(messages=messages, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nWhat is os.path?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    im_start, im_end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2  # markers are single special tokens


def test_heldout_perplexity_is_low(tokenizer):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    model = transformers.LlamaForCausalLM.from_pretrained(DEMO, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    text = (DEMO / "heldout.txt").read_text(encoding="utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:PPL_TOKENS]
    assert len(ids) == PPL_TOKENS
    x = torch.tensor(ids).view(-1, WINDOW)  # [windows, S]
    nll = 0.0
    with torch.no_grad():
        for i in range(0, len(x), 8):
            batch = x[i: i + 8]
            logits = model(input_ids=batch).logits.float()
            nll += torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
            ).item()
    ppl = math.exp(nll / (x.shape[0] * (WINDOW - 1)))
    print(f"demo model held-out perplexity: {ppl:.2f}")
    assert ppl < PPL_BOUND
