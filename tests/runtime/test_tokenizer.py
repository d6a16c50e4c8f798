"""Tokenizer, chat template and incremental detokenization (multi-byte, stop strings)."""
from __future__ import annotations

import json
import shutil

import pytest

from runtime.core.detokenizer import IncrementalDetokenizer
from runtime.core.tokenizer import Tokenizer, eos_token_ids

MULTIBYTE = "naïve café — 日本語のテキスト 🙂🚀 Grüße"


@pytest.fixture(scope="module")
def tok(tiny_model):
    return Tokenizer(tiny_model, (2,))


def test_round_trip_and_eos(tok):
    ids = tok.encode("The quick brown fox")
    assert tok.decode(ids) == "The quick brown fox"
    assert tok.eos_token_ids == (2,)
    assert tok.token_to_id("</s>") == 2


def test_chat_template_renders_with_generation_prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == tok.token_to_id("<|im_start|>")


def _stream(tok, ids, **kw):
    detok = IncrementalDetokenizer(tok, **kw)
    pieces = [detok.push([i]) for i in ids]
    pieces.append(detok.flush())
    return pieces, detok


def test_multibyte_characters_are_never_split(tok):
    ids = tok.encode(MULTIBYTE)
    assert any("\ufffd" in tok.decode([i]) for i in ids), "corpus should split some characters"
    pieces, detok = _stream(tok, ids)
    assert "".join(pieces) == MULTIBYTE == detok.text
    assert not any("\ufffd" in p for p in pieces)


def test_stop_string_truncates_and_holds_back_partial_matches(tok):
    text = "Hello, world! How are you today?"
    ids = tok.encode(text)
    pieces, detok = _stream(tok, ids, stop=["How are"])
    assert detok.stopped and detok.stop_string == "How are"
    assert "".join(pieces) == "Hello, world! " == detok.text
    assert not any("H" in p for p in pieces[1:])      # the "H" of "How" was held back


def test_held_back_prefix_is_released_when_it_does_not_match(tok):
    ids = tok.encode("a b c d")
    detok = IncrementalDetokenizer(tok, stop=["c x"])
    out = "".join(detok.push([i]) for i in ids)
    assert not detok.stopped
    assert out + detok.flush() == "a b c d"


def test_stop_inside_one_token_cuts_mid_token(tok):
    ids = tok.encode("The quick brown fox")
    pieces, detok = _stream(tok, ids, stop=["uic"])
    assert detok.text == "The q" and "".join(pieces) == "The q"


def _with_eos(folder, eos: str) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": eos}))


def _a_merged_token(folder) -> str:
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    return max(vocab, key=len)


@pytest.mark.parametrize("eos", ["</s>", "<|im_end|>", "merged", "no such token"])
def test_eos_ids_without_the_tokenizer_agree_with_the_parsed_one(tiny_model, tmp_path, eos):
    """Added tokens come from the partial decode, a vocabulary token from the full parse,
    an unknown one from neither: the ids are the tokenizer's every time."""
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    _with_eos(folder, _a_merged_token(folder) if eos == "merged" else eos)
    assert eos_token_ids(folder, (7,)) == Tokenizer(folder, (7,)).eos_token_ids
    assert len(eos_token_ids(folder, (7,))) == (1 if eos == "no such token" else 2)


def test_eos_ids_survive_a_vocabulary_token_named_like_the_key(tiny_model, tmp_path):
    """A first `"added_tokens"` in the text that is not the top-level list (here a token of
    the vocabulary, written before it) sends the lookup to the full parse."""
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["added_tokens"] = max(vocab.values()) + 1000
    added = data.pop("added_tokens")
    (folder / "tokenizer.json").write_text(json.dumps({**data, "added_tokens": added}))
    assert (folder / "tokenizer.json").read_text().index('"added_tokens"') \
        < (folder / "tokenizer.json").read_text().index('"added_tokens": [')
    assert eos_token_ids(folder) == Tokenizer(folder).eos_token_ids != ()


def test_eos_ids_need_the_tokenizer_file(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        eos_token_ids(tmp_path)


def test_eos_ids_beyond_the_head_that_is_read_come_from_the_full_parse(tiny_model, tmp_path):
    """Thousands of added tokens push the eos past the head the lookup decodes."""
    from runtime.core.tokenizer import ADDED_TOKENS_HEAD_BYTES, _added_token_id

    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    _with_eos(folder, "<|im_end|>")
    data = json.loads((folder / "tokenizer.json").read_text())
    eos = [t for t in data["added_tokens"] if t["content"] == "<|im_end|>"]
    others = [t for t in data["added_tokens"] if t["content"] != "<|im_end|>"]
    first_free = max(data["model"]["vocab"].values()) + len(data["added_tokens"]) + 1
    extra = [{**others[0], "id": first_free + i, "content": f"<|extra_{i}_{'x' * 60}|>"} for i in range(4000)]
    (folder / "tokenizer.json").write_text(json.dumps({**data, "added_tokens": others + extra + eos}))
    assert (folder / "tokenizer.json").read_text().index("<|im_end|>") > ADDED_TOKENS_HEAD_BYTES
    assert _added_token_id(folder / "tokenizer.json", "<|im_end|>") is None
    assert eos_token_ids(folder) == Tokenizer(folder).eos_token_ids == (eos[0]["id"],)
