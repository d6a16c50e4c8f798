"""Tiny model folders with random weights, for any test (every architecture the runtime serves).

`make_model(dir, arch="llama")` writes what DESIGN.md calls a model folder:
config.json, model.safetensors (or shards + index), tokenizer.json made with
the `tokenizers` library, and tokenizer_config.json with a chat template.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

# Training text for the tokenizer: ASCII prose, code and some multi-byte text
# so that detokenization of split UTF-8 characters gets exercised.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n",
    "Serverless GPU pools scale to zero when idle and thaw on the first request.",
    "Continuous batching lets new requests join while others decode tokens.",
    "Paged attention stores keys and values in fixed-size blocks of memory.",
    "naïve café résumé — déjà vu; Grüße aus München; 日本語のテキスト; emoji 🙂🚀",
    "import os\nimport sys\nfor i in range(10):\n    print(i, os.getcwd())\n",
    "Hello, world! How are you today? I am fine, thank you very much.",
]

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
# transformers config class and the fields a tiny model of the family needs beyond the
# common ones (head_dim: the families whose default is not hidden / heads)
FAMILY_CONFIGS = {
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=48, norm_topk_prob=True)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=32, sliding_window=16,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=10.0, pad_token_id=0)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=32, sliding_window=16,
                                        layer_types=["sliding_attention", "full_attention"], pad_token_id=0)),
    "phi3": ("Phi3Config", dict(pad_token_id=0)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=8, num_experts_per_tok=2)),
}


@dataclass(frozen=True)
class ModelSpec:
    arch: str = "llama"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 512
    tie_word_embeddings: Optional[bool] = None   # None: the family's default
    rope_scaling: Optional[dict] = None
    dtype: str = "float32"
    max_shard_size: Optional[str] = None         # e.g. "100KB" to force sharding
    seed: int = 0
    config: Optional[dict] = None                # more config fields, e.g. {"sliding_window": 16}


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on CORPUS; ids of specials are fixed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 8, trainer=trainer)
    return tok


def _hf_config(spec: ModelSpec, tokenizer):
    import transformers

    common = dict(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.token_to_id("<s>"),
        eos_token_id=tokenizer.token_to_id("</s>"),
        rms_norm_eps=1e-6,
    )
    if spec.tie_word_embeddings is not None:
        common["tie_word_embeddings"] = spec.tie_word_embeddings
    common.update(spec.config or {})
    if spec.arch == "llama":
        return transformers.LlamaConfig(rope_scaling=spec.rope_scaling, **common)
    if spec.arch == "mistral":
        return transformers.MistralConfig(**{"sliding_window": None, **common})
    if spec.arch == "qwen2":
        common.setdefault("tie_word_embeddings", True)
        return transformers.Qwen2Config(**common)
    if spec.arch in FAMILY_CONFIGS:
        name, family = FAMILY_CONFIGS[spec.arch]
        return getattr(transformers, name)(**{**family, **common})
    raise ValueError(f"arch: unknown architecture {spec.arch!r}")


def make_model(path: Path | str, spec: ModelSpec = ModelSpec(), **overrides) -> Path:
    """Write a model folder with random weights to `path` and return it."""
    import torch
    import transformers

    if overrides:
        spec = ModelSpec(**{**spec.__dict__, **overrides})
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    config = _hf_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = getattr(transformers, ARCHITECTURES[spec.arch])(config)
    _spread_weights(model)
    model = model.to(getattr(torch, spec.dtype))
    kwargs = {"safe_serialization": True}
    if spec.max_shard_size:
        kwargs["max_shard_size"] = spec.max_shard_size
    model.save_pretrained(path, **kwargs)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE, "model_max_length": spec.max_position_embeddings,
    }, indent=2))
    return path


def _spread_weights(model) -> None:
    """Random init with a larger std so greedy argmax is decisive (no near-ties)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.08)


def upload_model(path: Path | str, s3_client, bucket: str, prefix: str) -> str:
    """Upload every file of a model folder under s3://bucket/prefix/; return the URI."""
    prefix = prefix.strip("/")
    for file in sorted(Path(path).iterdir()):
        if file.is_file():
            s3_client.upload_file(str(file), bucket, f"{prefix}/{file.name}")
    return f"s3://{bucket}/{prefix}/"
