"""Incremental detokenization for streaming, with stop strings.

push(new_token_ids) returns the new text since the last call. Decoding works on a
short window of tokens (prefix_offset..), so each push costs O(1) tokens, and text
is held back while the window's decoding ends with U+FFFD (a multi-byte character
split across tokens). With stop strings, text that could be the start of one is
held back too; on a match the text is cut before the stop string and `stopped` is
set. flush() releases what is still held back once the request has ended.
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, stop: Optional[Sequence[str]] = None,
                 skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._stop = [s for s in (stop or []) if s]
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""           # decoded so far (cut at the stop string once stopped)
        self._emitted = 0        # how much of self.text was returned
        self.stopped = False
        self.stop_string: Optional[str] = None

    def push(self, new_token_ids: Sequence[int]) -> str:
        if self.stopped:
            return ""
        self._ids.extend(new_token_ids)
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        window = self._decode(self._ids[self._prefix_offset:])
        if len(window) > len(prefix) and not window.endswith("\ufffd"):
            self.text += window[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release()

    def flush(self) -> str:
        """The request ended: decode any held-back bytes and return all text not yet returned."""
        if not self.stopped and self._read_offset < len(self._ids):
            prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
            self.text += self._decode(self._ids[self._prefix_offset:])[len(prefix):]
            self._read_offset = len(self._ids)
            self._match_stop()
        delta = self.text[self._emitted:]
        self._emitted = len(self.text)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def _release(self) -> str:
        if self._match_stop():
            safe = len(self.text)
        else:
            safe = len(self.text) - self._partial_stop_len()
        delta = self.text[self._emitted:safe] if safe > self._emitted else ""
        self._emitted = max(self._emitted, safe)
        return delta

    def _match_stop(self) -> bool:
        if not self._stop:
            return False
        longest = max(len(s) for s in self._stop)
        begin = max(0, self._emitted - longest + 1)
        hits = [(self.text.find(s, begin), s) for s in self._stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[:index]
        self.stopped, self.stop_string = True, stop
        return True

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:n]):
                    best = n
                    break
        return best
