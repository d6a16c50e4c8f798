"""GGUF files of a Hugging Face Llama folder, so that llama.cpp runs the very weights thawpool runs.

`export_gguf(model_dir, out, qtype, vocab_from)` writes what llama.cpp's convert_hf_to_gguf
writes (tests/support/gguf_files.py does the tensors: llama.cpp's names, q/k rows permuted
for its rotary layout, 2-D weights in `qtype`, 1-D ones in F32) and takes the vocabulary
(every `tokenizer.*` key: BPE model, pre-tokenizer, tokens, token types, merges, BOS/EOS,
chat template) from `vocab_from`, a GGUF of the same model: the file the folder was
imported from, so llama.cpp tokenizes as it does for the published file.

F32 holds the folder's weights bit for bit; Q8_0 holds them in llama.cpp's 8-bit blocks,
quantized by `gguf.quants` (numpy, the rounding of ggml's reference quantizer).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE_TYPES = {"F32": 0, "Q8_0": 7}       # general.file_type: llama.cpp's LLAMA_FTYPE_ALL_F32, _MOSTLY_Q8_0


def cached_gguf(model_dir: Path, cache: Path, qtype: str, vocab_from: Path) -> Path:
    """`cache/<folder name>.<qtype>.gguf`, exported on first use."""
    out = cache / f"{model_dir.name}.{qtype.lower()}.gguf"
    if not out.is_file():
        export_gguf(model_dir, out, qtype, vocab_from)
    return out


def export_gguf(model_dir: Path, out: Path, qtype: str, vocab_from: Path) -> Path:
    """Write the GGUF of `model_dir` with its 2-D weights in `qtype` (F32 or Q8_0) to `out`."""
    from tests.support.gguf_files import write_model_gguf

    if qtype not in FILE_TYPES:
        raise ValueError(f"qtype: {qtype!r} is not one of {', '.join(FILE_TYPES)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")     # an interrupted export leaves no file to reuse
    try:
        write_model_gguf(partial, model_dir, qtype, tokenizer=copy_vocab(vocab_from),
                         metadata=lambda writer: _describe(writer, model_dir.name, qtype))
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def _describe(writer: Any, name: str, qtype: str) -> None:
    """The general.* keys convert_hf_to_gguf adds that say what the file holds."""
    import gguf

    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def copy_vocab(source: Path) -> Callable[[Any], None]:
    """A writer step that adds `source`'s `tokenizer.*` keys with their GGUF value types."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    # (key, value, type, element type of an array): read now, while the file is open
    keys = [(f.name, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
            for f in reader.fields.values() if f.name.startswith("tokenizer.")]

    def write(writer: Any) -> None:
        for name, value, kind, element in keys:
            writer.add_key_value(name, value, kind, sub_type=element)
    return write
