"""benchmarks/gguf_export.py: the GGUF files llama.cpp runs in benchmarks/peers.py hold the
model folder's own weights (F32 bit for bit, Q8_0 as its 8-bit blocks) and the vocabulary
of the GGUF they name, so our importer reads them back to the folder it started from."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.gguf_export import cached_gguf, export_gguf
from runtime.gguf.importer import import_gguf, read_file_header
from tests.support.gguf_files import add_bpe_vocab, decode, encode

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(scope="module")
def vocab_source(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF of the tiny model whose vocabulary says more than the folder's tokenizer.json
    would: llama.cpp's pre-tokenizer name for SmolLM and a chat template."""
    from tests.support.gguf_files import write_model_gguf

    def vocab(writer: object) -> None:
        add_bpe_vocab(writer, tiny_model, pre="smollm")
        writer.add_chat_template(TEMPLATE)        # type: ignore[attr-defined]

    path = tmp_path_factory.mktemp("vocab") / "source.q4_0.gguf"
    write_model_gguf(path, tiny_model, "Q4_0", tokenizer=vocab)
    return path


def _weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def _tokenizer_keys(path: Path) -> dict[str, object]:
    return {k: v for k, v in read_file_header(path).metadata.items() if k.startswith("tokenizer.")}


def test_f32_export_imports_back_to_the_folders_weights_and_the_sources_vocabulary(
        tiny_model: Path, vocab_source: Path, tmp_path: Path) -> None:
    out = export_gguf(tiny_model, tmp_path / "m.f32.gguf", "F32", vocab_source)
    meta = read_file_header(out).metadata
    assert meta["general.file_type"] == 0 and meta["general.name"] == tiny_model.name
    assert _tokenizer_keys(out) == _tokenizer_keys(vocab_source)
    assert meta["tokenizer.ggml.pre"] == "smollm" and meta["tokenizer.chat_template"] == TEMPLATE
    folder = import_gguf(out, tmp_path / "imported")
    got, want = _weights(folder), _weights(tiny_model)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert np.array_equal(got[name], w), name
    from runtime.core.tokenizer import Tokenizer

    text = "def add(a, b):\n    return a + b  # 2024"
    assert Tokenizer(folder).encode(text) == Tokenizer(import_gguf(vocab_source, tmp_path / "src")).encode(text)


def test_q8_0_export_holds_the_weights_in_8_bit_blocks(tiny_model: Path, vocab_source: Path,
                                                       tmp_path: Path) -> None:
    out = export_gguf(tiny_model, tmp_path / "m.q8_0.gguf", "Q8_0", vocab_source)
    header = read_file_header(out)
    assert header.metadata["general.file_type"] == 7
    kinds = {t.name: t.type_name for t in header.tensors}
    assert kinds["blk.0.attn_q.weight"] == "Q8_0" and kinds["token_embd.weight"] == "Q8_0"
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    got = _weights(import_gguf(out, tmp_path / "imported", dequantize=True))
    rng = np.random.default_rng(0)
    for name, w in _weights(tiny_model).items():
        expected = w if w.ndim == 1 else decode(encode(w, "Q8_0", rng), "Q8_0").reshape(w.shape)
        assert np.array_equal(got[name], expected), name


def test_the_cache_reuses_an_export_and_refuses_other_types(tiny_model: Path, vocab_source: Path,
                                                          tmp_path: Path) -> None:
    first = cached_gguf(tiny_model, tmp_path, "F32", vocab_source)
    assert first == tmp_path / f"{tiny_model.name}.f32.gguf"
    # a second export would need the vocabulary file: reusing the first does not
    assert cached_gguf(tiny_model, tmp_path, "F32", tmp_path / "absent.gguf") == first
    with pytest.raises(ValueError, match="Q4_K"):
        export_gguf(tiny_model, tmp_path / "m.gguf", "Q4_K", vocab_source)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
