"""Tool calls out of the model's text, whole or streamed: Hermes `<tool_call>` blocks and Llama 3 JSON.

The formats:
- Hermes (Qwen 2.5/3, Hermes, and runtime/serve/tool_prompt.py's fallback prompt): any number of
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, after optional text;
- JSON (Llama 3.1+): the whole answer is `{"name": ..., "parameters": {...}}`, maybe after
  `<|python_tag|>`, several separated by `;`; also the grammar-forced output of
  tool_choice required / named (an object, or an array of them: wire/tools.py).

`ToolCallParser` is the only parser: a whole answer is one `push` and `finish`, so a
stream's deltas always assemble to the non-streamed answer. Its rules do not depend on
where the chunks break:
- content is the text before the first call (whitespace right before a call dropped);
  text between and after calls is dropped, as vLLM's Hermes parser does;
- text that may be the start of `<tool_call>` is held back until it is known not to be;
- an answer whose first non-space is `{` or `<|python_tag|>` (or any forced answer) is
  held whole until the end: all calls become tool calls, anything else is content;
- a Hermes block whose JSON is not a call is given back as content, tags included.
A call is emitted whole, once its block closes (JSON: at the end).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from wire.json_input import MAX_JSON_DEPTH, TooDeep, json_depth, loads
from wire.tools import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"   # Llama 3.1's start of a call (a special token, usually skipped)


@dataclass
class Parsed:
    """What a piece of text turned out to be: content to show, and calls."""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def message_content(self) -> Optional[str]:
        """OpenAI's: null when the answer is only calls."""
        return None if self.calls and not self.content else self.content

    def __add__(self, other: "Parsed") -> "Parsed":
        return Parsed(self.content + other.content, self.calls + other.calls)


class ToolCallParser:
    """One choice's output, streamed through. `forced`: the grammar made it JSON calls."""

    def __init__(self, forced: bool = False):
        self._mode = "json" if forced else "start"   # start | text | call | json
        self._buffer = ""
        self._calls = 0

    @property
    def called(self) -> bool:
        return self._calls > 0

    def push(self, text: str) -> Parsed:
        self._buffer += text
        out = Parsed()
        while (step := self._step()) is not None:
            out += step
        return out

    def finish(self) -> Parsed:
        """What was held back, at the end of the output."""
        buffer, self._buffer = self._buffer, ""
        if self._mode == "call":
            return self._block(buffer)
        if self._mode == "json":
            return self._json(buffer)
        return Parsed("" if self.called else buffer)

    def _step(self) -> Optional[Parsed]:
        """Consume what can be decided now; None when the rest must wait for more text."""
        if self._mode == "start":
            return self._start()
        if self._mode == "text":
            return self._text()
        if self._mode == "call":
            end = self._buffer.find(CLOSE)
            if end < 0:
                return None
            body, self._buffer, self._mode = self._buffer[:end], self._buffer[end + len(CLOSE):], "text"
            return self._block(body)
        return None   # json: all at the end

    def _start(self) -> Optional[Parsed]:
        head = self._buffer.lstrip()
        if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
            return None   # only whitespace, or maybe the tag: wait
        self._mode = "json" if head.startswith(("{", PYTHON_TAG)) else "text"
        return Parsed()

    def _text(self) -> Optional[Parsed]:
        start = self._buffer.find(OPEN)
        if start >= 0:
            before, self._buffer, self._mode = self._buffer[:start], self._buffer[start + len(OPEN):], "call"
            return Parsed("" if self.called else before.rstrip())
        # hold back a possible start of the tag, and whitespace that may precede one
        safe = self._buffer[:len(self._buffer) - _partial_tag(self._buffer)].rstrip()
        if not safe:
            return None
        self._buffer = self._buffer[len(safe):]
        return Parsed("" if self.called else safe)

    def _block(self, body: str) -> Parsed:
        call = self._call(_loads(body))
        return Parsed(calls=[call]) if call is not None else Parsed(OPEN + body + CLOSE)

    def _json(self, text: str) -> Parsed:
        """All calls, or all content."""
        values = _json_values(text.strip().removeprefix(PYTHON_TAG))
        objects = [o for v in values or [] for o in (v if isinstance(v, list) else [v])]
        if not objects or any(_call_parts(o) is None for o in objects):
            return Parsed(text)
        return Parsed(calls=[c for c in map(self._call, objects) if c is not None])

    def _call(self, value: Any) -> Optional[ToolCall]:
        parts = _call_parts(value)
        if parts is None:
            return None
        self._calls += 1
        return ToolCall(index=self._calls - 1, id=f"call_{uuid.uuid4().hex[:24]}", name=parts[0],
                        arguments=parts[1])


def parse_tool_calls(text: str, forced: bool = False) -> Parsed:
    """A whole answer: its content and its calls."""
    parser = ToolCallParser(forced)
    return parser.push(text) + parser.finish()


def finish_reason(reason: Optional[str], called: bool) -> Optional[str]:
    """OpenAI's: "tool_calls" when the model ended its turn having called tools."""
    return "tool_calls" if called and reason == "stop" else reason


def _partial_tag(text: str) -> int:
    """The length of the longest end of `text` that is a start of OPEN."""
    return next((n for n in range(min(len(OPEN) - 1, len(text)), 0, -1) if OPEN.startswith(text[-n:])), 0)


def _call_parts(value: Any) -> Optional[tuple[str, str]]:
    """(name, arguments as JSON text) of a call object; Llama 3 says `parameters`."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):   # some models write the arguments as JSON text
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def _loads(text: str) -> Any:
    """The value, or None when not JSON or nested too deep to take as a call."""
    try:
        return loads(text)
    except (ValueError, TooDeep):
        return None


def _json_values(text: str) -> Optional[list[Any]]:
    """JSON values one after another, separated by whitespace or `;`; None if not that."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):   # not JSON, or nested past json's own limit
            return None
        if json_depth(value) > MAX_JSON_DEPTH:
            return None
        values.append(value)
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
    return values
