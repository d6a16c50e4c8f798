"""Tokenizer, chat template and incremental detokenization (multi-byte, stop strings)."""
from __future__ import annotations

import pytest

from runtime.core.detokenizer import IncrementalDetokenizer
from runtime.core.tokenizer import Tokenizer

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
