"""tokenizer.json as the importer writes it (runtime/gguf/tokenizer_file.py): merges as single
strings where that reads back to the very tokenizer, tokenizers' own file otherwise."""
from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers

from runtime.gguf.importer import import_gguf
from runtime.gguf.tokenizer_file import fast_form
from tests.support.gguf_files import write_model_gguf


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_an_imported_folder_has_its_merges_as_strings_and_reads_back_the_same(tiny_model, tmp_path):
    write_model_gguf(tmp_path / "m.gguf", tiny_model, "Q8_0")
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    text = (folder / "tokenizer.json").read_text()
    merges = json.loads(text)["model"]["merges"]
    assert merges and all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges)
    theirs = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    ours = Tokenizer.from_str(text)
    sample = "def add(a, b):\n    return a + b  # naïve 日本語 🙂"
    assert ours.encode(sample).ids == theirs.encode(sample).ids
    ours_model, theirs_model = json.loads(ours.to_str())["model"], json.loads(theirs.to_str())["model"]
    assert (ours_model["vocab"], ours_model["merges"]) == (theirs_model["vocab"], theirs_model["merges"])


def test_the_string_form_keeps_every_merge_and_its_rank():
    tok = _bpe({"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}, [("b", "c"), ("a", "b"), ("a", "bc")])
    form = fast_form(tok)
    assert json.loads(form)["model"]["merges"] == ["b c", "a b", "a bc"]
    assert Tokenizer.from_str(form).to_str() == tok.to_str()
    assert Tokenizer.from_str(form).encode("abc").tokens == ["abc"]      # b c first, then a bc


def test_a_token_with_a_space_keeps_tokenizers_own_form():
    tok = _bpe({"a": 0, " b": 1, "a b": 2}, [("a", " b")])
    assert fast_form(tok) == tok.to_str()
    assert json.loads(fast_form(tok))["model"]["merges"] == [["a", " b"]]


def test_a_model_without_merges_is_written_as_tokenizers_writes_it():
    tok = Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    assert fast_form(tok) == tok.to_str()
