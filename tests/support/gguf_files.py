"""GGUF files for tests, written with the `gguf` package the way llama.cpp's
convert_hf_to_gguf writes them: llama.cpp tensor names, q/k rows permuted for its rotary
layout (llama), 2-D weights quantized, 1-D ones in F32, the vocabulary as metadata.

`write_model_gguf(path, model_dir, qtype)` returns the weights a reader must get back, in
the Hugging Face layout: each quantized tensor dequantized. Quant types that `gguf.quants`
cannot quantize (the K-quants) get random blocks with small scales instead, so every bit
of their encoding is exercised; the expected weights are those blocks dequantized.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

# llama.cpp's names, written out here rather than taken from the importer under test
_MODEL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
          "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
          "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name in _MODEL:
        return _MODEL[hf_name]
    _, _, n, rest = hf_name.split(".", 3)
    return f"blk.{n}.{_LAYER[rest]}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute, on rows (float or quantized bytes alike)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(w: np.ndarray, qtype: str, rng: np.random.Generator) -> np.ndarray:
    import gguf
    import gguf.quants

    kind = gguf.GGMLQuantizationType[qtype]
    try:
        return gguf.quants.quantize(w.astype(np.float32), kind)
    except NotImplementedError:
        return random_blocks(w.shape, qtype, rng)


def decode(raw: np.ndarray, qtype: str) -> np.ndarray:
    import gguf
    import gguf.quants

    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]), dtype=np.float32)


def random_blocks(shape: tuple[int, ...], qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks whose fp16 scales keep the weights near N(0, 0.05)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rows, blocks = math.prod(shape[:-1]), shape[-1] // block
    raw = rng.integers(0, 256, (rows * blocks, size), dtype=np.uint8)

    def f16(at: int, low: float, high: float) -> None:
        raw[:, at:at + 2] = rng.uniform(low, high, rows * blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)

    if qtype == "Q4_K":                 # w = d*sc*q - dmin*m, q in 0..15: dmin centres it
        f16(0, 2e-4, 3e-4), f16(2, 1.5e-3, 2e-3)
    elif qtype == "Q5_K":               # q in 0..31
        f16(0, 1e-4, 1.5e-4), f16(2, 1.5e-3, 2e-3)
    elif qtype == "Q6_K":               # w = d*scale*(q-32), symmetric; d is the last 2 bytes
        f16(size - 2, 3e-5, 5e-5)
    else:
        raise ValueError(f"qtype: no random blocks for {qtype}")
    return raw.reshape(*shape[:-1], blocks * size)


def write_model_gguf(path: Path, model_dir: Path, qtype: str, *, seed: int = 0, arch: Optional[str] = None,
                     metadata: Optional[Callable[[Any], None]] = None, skip: tuple[str, ...] = (),
                     tokenizer: Optional[Callable[[Any], None]] = None,
                     types: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
    """The GGUF of the Hugging Face folder `model_dir` with its 2-D weights in `qtype`
    (`types`: another type for the weights whose names end with a key, as llama.cpp's
    Q4_K_M keeps v_proj and down_proj in Q6_K).

    `metadata(writer)` adds or overrides keys, `skip` leaves tensors (GGUF names) out and
    `tokenizer(writer)` replaces the vocabulary written from model_dir's tokenizer.json."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    arch = arch or config["model_type"]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hparams(writer, arch, config)
    if tokenizer is not None:
        tokenizer(writer)
    else:
        add_bpe_vocab(writer, model_dir, pre="default")
    if metadata is not None:
        metadata(writer)
    expected: dict[str, np.ndarray] = {}
    for name, w in load_file(str(model_dir / "model.safetensors")).items():
        w = w.astype(np.float32)
        if w.ndim == 1:
            raw, kind, expected[name] = w, None, w
        else:
            this = next((t for end, t in (types or {}).items() if name.endswith(end)), qtype)
            raw, kind = encode(w, this, rng), gguf.GGMLQuantizationType[this]
            expected[name] = decode(raw, this).reshape(w.shape)
            if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                kind = None               # the writer takes their type from the array
        heads = _permute_heads(name, config) if arch == "llama" else None
        if heads:
            raw = permute(raw, heads)
        if gguf_name(name) not in skip:
            writer.add_tensor(gguf_name(name), raw, raw_dtype=kind)
    if _rope(config)[1].get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(model_dir, config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def _write_hparams(writer: Any, arch: str, config: dict[str, Any]) -> None:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(_rope(config)[0])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])


def _permute_heads(name: str, config: dict[str, Any]) -> Optional[int]:
    if name.endswith("q_proj.weight"):
        return int(config["num_attention_heads"])
    if name.endswith("k_proj.weight"):
        return int(config["num_key_value_heads"])
    return None


def _rope(config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, scaling): transformers 5 writes both into rope_parameters."""
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or params.get("rope_theta", 10000.0)), params


def llama3_rope_factors(model_dir: Path, config: dict[str, Any]) -> np.ndarray:
    """What convert_hf_to_gguf stores as rope_freqs for Llama 3 rope scaling: the divisor of
    each rotary frequency, taken here from transformers' own Llama 3 rope (not the importer's)."""
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](transformers.AutoConfig.from_pretrained(model_dir), "cpu")
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    plain = 1.0 / (_rope(config)[0] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return (plain / scaled).numpy().astype(np.float32)


def add_bpe_vocab(writer: Any, model_dir: Path, pre: str) -> None:
    """A byte-level BPE tokenizer.json as llama.cpp's get_vocab_base writes it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    write_bpe_vocab(writer, tok, pre, bos=cfg.get("bos_token"), eos=cfg.get("eos_token"),
                    chat_template=cfg.get("chat_template"))


def write_bpe_vocab(writer: Any, tok: Any, pre: str, *, bos: Optional[str], eos: Optional[str],
                    chat_template: Optional[str] = None, add_bos: bool = False) -> None:
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    added = {a.content: a.special for a in tok.get_added_tokens_decoder().values()}
    types = [NORMAL if t not in added else CONTROL if added[t] else USER_DEFINED for t in tokens]
    merges = json.loads(tok.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    if bos is not None:
        writer.add_bos_token_id(vocab[bos])
    if eos is not None:
        writer.add_eos_token_id(vocab[eos])
    writer.add_add_bos_token(add_bos)
    if chat_template:
        writer.add_chat_template(chat_template)


def write_spm_vocab(writer: Any, model_file: Path, user_defined: tuple[str, ...] = ()) -> None:
    """A SentencePiece model as llama.cpp's _create_vocab_sentencepiece writes it."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else BYTE if sp.is_byte(i)
                     else USER_DEFINED if piece in user_defined else NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)


def write_vocab_only(path: Path, vocab: Callable[[Any], None], arch: str = "llama") -> None:
    """A GGUF with metadata and no tensors: enough for the tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    vocab(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
