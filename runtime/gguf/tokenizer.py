"""tokenizer.json and tokenizer_config.json from a GGUF file's vocabulary.

A GGUF carries the vocabulary as metadata under llama.cpp's keys (`tokenizer.ggml.*`),
not a tokenizer.json. Two kinds are rebuilt here, each the way Hugging Face spells it:

  gpt2   byte-level BPE: tokens and merges as stored; the pre-tokenizer (how text is cut
         before merging) is named by `tokenizer.ggml.pre`, one of PRE_TOKENIZERS.
  llama  SentencePiece BPE (Llama 1/2, Mistral): tokens with scores and no merges; the
         merges are recovered from the scores (a token's score ranks the merge that
         makes it), byte fallback for characters outside the vocabulary, "▁" for spaces.

Tokens marked CONTROL (and UNKNOWN) become special added tokens, USER_DEFINED ones
plain added tokens, so both are matched whole in text. BOS/EOS are added as
`tokenizer.ggml.add_bos_token` / `add_eos_token` say.
"""
from __future__ import annotations

from typing import Any, Optional

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from spec.gguf import GGUFError
from spec.gguf_model import PRE_TOKENIZERS, PreTokenizer, check_tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4         # tokenizer.ggml.token_type (BYTE 6: not added)


def build_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """(the tokenizer, tokenizer_config.json) that the metadata describes."""
    check_tokenizer(meta)
    kind = meta.get("tokenizer.ggml.model")
    tokens = _strings(meta, "tokenizer.ggml.tokens")
    types = _ints(meta, "tokenizer.ggml.token_type", len(tokens), default=NORMAL)
    tok = _byte_level(meta, tokens) if kind == "gpt2" else _sentencepiece(meta, tokens, types)
    _add_special(tok, tokens, types)
    config = _tokenizer_config(meta, tokens, default_bos=kind == "llama")
    tok.post_processor = _post_processor(config, tokens, byte_level=kind == "gpt2")
    return tok, config


def _byte_level(meta: dict[str, Any], tokens: list[str]) -> Tokenizer:
    pre = PRE_TOKENIZERS[meta.get("tokenizer.ggml.pre", "default")]
    merges = [_merge(m) for m in _strings(meta, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab=_vocab(tokens), merges=merges, ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = byte_level_pre_tokenizer(pre)
    if pre.nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    return tok


def byte_level_pre_tokenizer(pre: PreTokenizer) -> Any:
    steps: list[Any] = [pre_tokenizers.Digits(individual_digits=True)] if pre.digits else []
    if pre.split is not None:
        steps += [pre_tokenizers.Split(Regex(pre.split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _merge(text: str) -> tuple[str, str]:
    cut = text.find(" ", 1)             # as llama.cpp reads them: the first space after the start
    if cut < 0:
        raise GGUFError(f"tokenizer.ggml.merges: {text!r} is not two tokens separated by a space")
    return text[:cut], text[cut + 1:]


def _sentencepiece(meta: dict[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    scores = _floats(meta, "tokenizer.ggml.scores", len(tokens))
    vocab = _vocab(tokens)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id", types.index(UNKNOWN) if UNKNOWN in types else None)
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges_from_scores(tokens, types, scores, vocab),
                               unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _merges_from_scores(tokens: list[str], types: list[int], scores: list[float],
                        vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a normal token into two tokens of the vocabulary, best score first
    (the order transformers' SentencePiece converter gives them)."""
    pieces = {t for t, kind in zip(tokens, types) if kind in (NORMAL, USER_DEFINED)}
    found: list[tuple[str, str, float]] = []
    for token, kind, score in zip(tokens, types, scores):
        if kind != NORMAL:
            continue
        splits = [(token[:i], token[i:]) for i in range(1, len(token))]
        local = [(left, right, score) for left, right in splits if left in pieces and right in pieces]
        found += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)        # a repeated token keeps its first id
    return vocab


def _add_special(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    special = [AddedToken(t, special=True, normalized=False)
               for t, kind in zip(tokens, types) if kind in (CONTROL, UNKNOWN)]
    plain = [AddedToken(t, special=False, normalized=False)
             for t, kind in zip(tokens, types) if kind == USER_DEFINED]
    tok.add_special_tokens(special)
    tok.add_tokens(plain)


def _tokenizer_config(meta: dict[str, Any], tokens: list[str], default_bos: bool) -> dict[str, Any]:
    def token(key: str) -> Optional[str]:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        if index is None:
            return None
        if not isinstance(index, int) or not 0 <= index < len(tokens):
            raise GGUFError(f"tokenizer.ggml.{key}_token_id: {index!r} is not a token id")
        return tokens[index]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "bos_token": token("bos"), "eos_token": token("eos"), "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return config


def _post_processor(config: dict[str, Any], tokens: list[str], byte_level: bool) -> Any:
    steps: list[Any] = [processors.ByteLevel(trim_offsets=False)] if byte_level else []
    added = [config[f"{end}_token"] if config[f"add_{end}_token"] else None for end in ("bos", "eos")]
    for end, text in zip(("bos", "eos"), added):
        if config[f"add_{end}_token"] and text is None:
            raise GGUFError(f"tokenizer.ggml.add_{end}_token: set, but there is no {end} token")
    if any(added):
        bos, eos = added

        def piece(seq: str, type_id: int) -> str:
            return " ".join(f"{t}:{type_id}" for t in (bos, seq, eos) if t is not None)

        steps.append(processors.TemplateProcessing(
            single=piece("$A", 0), pair=f"{piece('$A', 0)} {piece('$B', 1)}",
            special_tokens=[(t, tokens.index(t)) for t in dict.fromkeys(a for a in added if a)]))
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else processors.Sequence(steps)


def _strings(meta: dict[str, Any], key: str) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise GGUFError(f"{key}: missing or not an array of strings")
    return value


def _ints(meta: dict[str, Any], key: str, n: int, default: int) -> list[int]:
    value = meta.get(key, [default] * n)
    if not isinstance(value, list) or len(value) != n or not all(isinstance(v, int) for v in value):
        raise GGUFError(f"{key}: not an array of {n} integers, one per token")
    return value


def _floats(meta: dict[str, Any], key: str, n: int) -> list[float]:
    value = meta.get(key)
    if not isinstance(value, list) or len(value) != n or not all(isinstance(v, (int, float)) for v in value):
        raise GGUFError(f"{key}: not an array of {n} scores, one per token (SentencePiece needs them)")
    return [float(v) for v in value]
