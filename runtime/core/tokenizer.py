"""Tokenizer over a model folder's tokenizer.json, with its chat template (jinja2)."""
from __future__ import annotations

import codecs
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Optional, Sequence

from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    from jinja2 import Template


class Tokenizer:
    def __init__(self, model_dir: str | Path, eos_token_ids: Sequence[int] = ()):
        model_dir = Path(model_dir)
        self._tok = HFTokenizer.from_file(str(_tokenizer_json(model_dir)))
        self.config: dict[str, Any] = _tokenizer_config(model_dir)
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.chat_template: Optional[str] = _template(self.config.get("chat_template"))
        self.eos_token_ids = self._eos_ids(eos_token_ids)
        self._template: Optional[Template] = None

    def _eos_ids(self, from_config: Sequence[int]) -> tuple[int, ...]:
        ids = list(from_config)
        if self.eos_token is not None:
            token_id = self._tok.token_to_id(self.eos_token)
            if token_id is not None:
                ids.append(token_id)
        return tuple(dict.fromkeys(ids))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        if self.chat_template is None:
            raise ValueError("messages: this model has no chat template")
        if self._template is None:
            self._template = _compile(self.chat_template)
        text: str = self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)
        return text

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **extra: Any) -> list[int]:
        """The template writes special tokens itself, so none are added on top; `extra`
        goes to the template as variables (`tools`)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **extra),
                           add_special_tokens=False)


def eos_token_ids(model_dir: str | Path, from_config: Sequence[int] = ()) -> tuple[int, ...]:
    """Tokenizer(model_dir, from_config).eos_token_ids without building the tokenizer, which
    is the slowest part of a small model's load (~0.1 s of Rust holding the GIL for a 49k
    BPE): the eos token is looked up among tokenizer.json's added tokens, where special
    tokens live, and only a token not found there costs the full parse."""
    model_dir = Path(model_dir)
    path = _tokenizer_json(model_dir)
    ids = list(from_config)
    eos = _token_text(_tokenizer_config(model_dir).get("eos_token"))
    if eos is not None:
        token_id = _added_token_id(path, eos)
        if token_id is None:
            token_id = HFTokenizer.from_file(str(path)).token_to_id(eos)
        if token_id is not None:
            ids.append(token_id)
    return tuple(dict.fromkeys(ids))


# tokenizers writes `added_tokens` before the model, in the file's first few KB (hundreds
# of special tokens included); only that head is read and decoded
ADDED_TOKENS_HEAD_BYTES = 256 * 1024


def _added_token_id(path: Path, content: str) -> Optional[int]:
    """The id of the added token `content`, decoding only the `added_tokens` list from the
    head of tokenizer.json; None where the list is not there or does not hold it."""
    with path.open("rb") as f:
        head = f.read(ADDED_TOKENS_HEAD_BYTES)
    text = codecs.getincrementaldecoder("utf-8")().decode(head)   # a cut character waits
    at = text.find('"added_tokens"')
    colon = text.find(":", at)
    if at < 0 or colon < 0:
        return None
    start = colon + 1
    while start < len(text) and text[start].isspace():
        start += 1
    try:
        added, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:          # cut by the head, or not JSON there
        return None
    if not isinstance(added, list):       # the first match was not the top-level key
        return None
    for token in added:
        if isinstance(token, dict) and token.get("content") == content and isinstance(token.get("id"), int):
            return int(token["id"])
    return None


def _tokenizer_json(model_dir: Path) -> Path:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"model: no tokenizer.json in {model_dir}")
    return path


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    return config


def _token_text(value: Any) -> Optional[str]:
    if isinstance(value, dict):     # {"content": "</s>", ...} in older configs
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template(value: Any) -> Optional[str]:
    if isinstance(value, list):     # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in value}
        value = named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


def _compile(source: str) -> Template:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **_: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now(timezone.utc).strftime(fmt)
    return env.from_string(source)


def _raise(message: str) -> NoReturn:
    raise ValueError(f"messages: {message}")
