"""What a GGUF header says as a Hugging Face model folder: config.json, the tensor names and
shapes, and the tokenizer kind; every check that needs no tensor data.

The pool runs `describe` at deploy on the header it read from S3 (a file it would refuse
on import is refused there, 422), the runtime's importer runs it before reading any
weights. Every refusal is a `GGUFError` whose message starts with the field or tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from spec.gguf import GGUFError, GGUFHeader, TensorInfo

# the version of what the importer writes (runtime/gguf/importer.py): a folder imported by
# another version is imported again (the pool's cache keys, scripts/real_model.py's marker)
IMPORT_FORMAT = 3


@dataclass(frozen=True)
class GgufArchitecture:
    hf_class: str                    # config.json "architectures"
    model_type: str
    permute_qk: bool                 # llama.cpp reorders q/k rows for its rotary layout
    attention_bias: bool = False
    qk_norm: bool = False            # RMSNorm over each head of q and k (Qwen3)


ARCHITECTURES = {
    "llama": GgufArchitecture("LlamaForCausalLM", "llama", permute_qk=True),
    "qwen2": GgufArchitecture("Qwen2ForCausalLM", "qwen2", permute_qk=False, attention_bias=True),
    "qwen3": GgufArchitecture("Qwen3ForCausalLM", "qwen3", permute_qk=False, qk_norm=True),
}

# GGUF tensor name (blk.N. prefix removed) -> Hugging Face name (model.layers.N. prefix removed)
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
MODEL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
DERIVED_TENSORS = ("rope_freqs.weight",)     # folded into config.json (Llama 3 rope scaling)

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), as Hugging Face's tokenizer.json writes them.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """How byte-level BPE text is cut before merging (`tokenizer.ggml.pre`)."""
    split: Optional[str] = None      # a regex before byte-level; None: GPT-2's own
    digits: bool = False             # each digit alone first
    ignore_merges: bool = False      # a word already in the vocabulary is one token
    nfc: bool = False                # NFC-normalized first


_GPT2, _DIGITS = PreTokenizer(), PreTokenizer(digits=True)
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **dict.fromkeys(("default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo"), _GPT2),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "command-r"), _DIGITS),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral"),
                    PreTokenizer(_LLAMA3, ignore_merges=True)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), PreTokenizer(_QWEN2, nfc=True)),
    "tekken": PreTokenizer(_TEKKEN, ignore_merges=True),
}
TOKENIZER_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece BPE"}


def hf_tensor_name(name: str) -> Optional[str]:
    """The Hugging Face name of a GGUF tensor, or None for one this format does not map."""
    if name in MODEL_TENSORS:
        return MODEL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    return None


def architecture(meta: dict[str, Any]) -> GgufArchitecture:
    name = meta.get("general.architecture")
    if name not in ARCHITECTURES:
        raise GGUFError(f"general.architecture: {name!r} is not supported "
                        f"(supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[str(name)]


def describe(header: GGUFHeader) -> tuple[dict[str, Any], list[tuple[str, TensorInfo]]]:
    """(config.json, [(Hugging Face name, tensor)] in file order), every check passed."""
    config = hf_config(header)
    check_tokenizer(header.metadata)
    return config, check_tensors(header, config, architecture(header.metadata))


def hf_config(header: GGUFHeader) -> dict[str, Any]:
    """config.json of the folder this file imports to (float32 weights)."""
    meta = header.metadata
    spec = architecture(meta)
    arch = str(meta["general.architecture"])

    def field(key: str, kind: type, default: Any = None) -> Any:
        full = f"{arch}.{key}"
        value = meta.get(full, default)
        if value is None:
            raise GGUFError(f"{full}: missing")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise GGUFError(f"{full}: {value!r} is not a{'n' if kind is int else ''} {kind.__name__}")
        return value

    hidden, heads = field("embedding_length", int), field("attention.head_count", int)
    head_dim = field("attention.key_length", int, hidden // max(heads, 1))
    if field("rope.dimension_count", int, head_dim) != head_dim:
        raise GGUFError(f"{arch}.rope.dimension_count: rotary over part of a head is not supported")
    embed = header.tensor("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise GGUFError("tensor token_embd.weight: missing")
    config: dict[str, Any] = {
        "architectures": [spec.hf_class], "model_type": spec.model_type,
        "hidden_size": hidden, "intermediate_size": field("feed_forward_length", int),
        "num_hidden_layers": field("block_count", int), "num_attention_heads": heads,
        "num_key_value_heads": field("attention.head_count_kv", int, heads), "head_dim": head_dim,
        "vocab_size": embed.shape[0],
        "max_position_embeddings": field("context_length", int, 2048),
        "rms_norm_eps": _shortest(field("attention.layer_norm_rms_epsilon", float)),
        "rope_theta": _shortest(field("rope.freq_base", float, 10000.0)),
        "tie_word_embeddings": header.tensor("output.weight") is None,
        "attention_bias": spec.attention_bias or header.tensor("blk.0.attn_q.bias") is not None,
        "torch_dtype": "float32",
    }
    config.update(_rope_scaling(meta, arch))
    for key, name in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(value, int):
            config[name] = value
    return config


def _shortest(value: float) -> float:
    """A float32 read from the file, written back as the shortest decimal that is that float32
    (1e-05, not 9.999999747378752e-06)."""
    import struct

    exact = struct.pack("<f", value)
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.pack("<f", float(text)) == exact:
            return float(text)
    return value


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return {}
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind == "linear" and isinstance(factor, (int, float)):
        return {"rope_scaling": {"rope_type": "linear", "factor": float(factor)}}
    raise GGUFError(f"{arch}.rope.scaling.type: {kind!r} is not supported (none or linear)")


def check_tokenizer(meta: dict[str, Any]) -> None:
    kind = meta.get("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        raise GGUFError(f"tokenizer.ggml.model: {kind!r} is not supported (gpt2: byte-level BPE, "
                        "llama: SentencePiece BPE)")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if kind == "gpt2" and pre not in PRE_TOKENIZERS:
        raise GGUFError(f"tokenizer.ggml.pre: {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GGUFError("tokenizer.ggml.tokens: missing")


def check_tensors(header: GGUFHeader, config: dict[str, Any],
                  spec: GgufArchitecture) -> list[tuple[str, TensorInfo]]:
    """Every tensor the model needs, present once and of its shape; no tensor it does not know."""
    expected = expected_shapes(config, spec)
    found: dict[str, TensorInfo] = {}
    for info in header.tensors:
        if info.name in DERIVED_TENSORS:
            continue
        name = hf_tensor_name(info.name)
        if name is None or name not in expected:
            raise GGUFError(f"tensor {info.name}: not part of a {config['model_type']} model "
                            f"with {config['num_hidden_layers']} layers")
        if info.shape != expected[name]:
            raise GGUFError(f"tensor {info.name}: shape {list(info.shape)}, expected {list(expected[name])}")
        found[name] = info
    optional = {"lm_head.weight"} | (set() if config["attention_bias"] else
                                     {n for n in expected if n.endswith("_proj.bias")})
    missing = [n for n in expected if n not in found and n not in optional]
    if missing:
        raise GGUFError(f"tensor {gguf_tensor_name(missing[0])}: missing")
    return [(name, info) for name, info in found.items()]


def expected_shapes(config: dict[str, Any], spec: GgufArchitecture) -> dict[str, tuple[int, ...]]:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (v, h)}
    layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
             "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
             "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
             "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i),
             "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if spec.qk_norm:
        layer.update({"self_attn.q_norm.weight": (config["head_dim"],),
                      "self_attn.k_norm.weight": (config["head_dim"],)})
    for n in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{n}.{k}": s for k, s in layer.items()})
    return shapes


def gguf_tensor_name(hf_name: str) -> str:
    for gguf, hf in MODEL_TENSORS.items():
        if hf == hf_name:
            return gguf
    _, _, n, rest = hf_name.split(".", 3)
    return f"blk.{n}.{next(g for g, h in LAYER_TENSORS.items() if h == rest)}"


def stop_token_ids(meta: dict[str, Any]) -> list[int]:
    """EOS and the end-of-turn ids llama.cpp also stops at (generation_config.json)."""
    ids = [meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    return list(dict.fromkeys(i for i in ids if isinstance(i, int)))
