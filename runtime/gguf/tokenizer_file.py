"""tokenizer.json written in the form `tokenizers` parses fastest, for the folders the
importer makes (the node's cache holds them and every cold start parses them).

Parsing the tokenizer is the long pole of a small model's warm cold start
(docs/cold-start.md), and most of it is the BPE merges. `tokenizers` writes them as pairs
(`["Ġ", "t"]`) but still reads its older form, one string with the two tokens split by a
space (`"Ġ t"`), which it parses in about half the time; without indentation the file is
also under half the bytes. The older form cannot hold a token with a space in it, so it
is used only where no merged token has one, and only when the file it gives parses back
to the very tokenizer written (`to_str()` equal); otherwise the file is `tokenizers`' own.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


def save_tokenizer(tok: Tokenizer, path: Path) -> None:
    path.write_text(fast_form(tok), encoding="utf-8")


def fast_form(tok: Tokenizer) -> str:
    """tok's tokenizer.json with its merges as single strings, where that reads back the same."""
    own = tok.to_str()
    data = json.loads(own)
    model = data.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges or not all(_plain_pair(m) for m in merges):
        return own
    model["merges"] = [" ".join(m) for m in merges]
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text if Tokenizer.from_str(text).to_str() == own else own


def _plain_pair(merge: Any) -> bool:
    return (isinstance(merge, list) and len(merge) == 2
            and all(isinstance(part, str) and part and " " not in part for part in merge))
