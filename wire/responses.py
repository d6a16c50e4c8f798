"""OpenAI response bodies, stream chunks, usage and logprobs, built from plain values.

The replica builds its answers with these; the control plane reads the same
shapes back (usage for metering) and rewrites only `model`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

TokenLogprobs = tuple[float, list[tuple[int, float]]]   # (chosen, [(token id, logprob)])
TokenText = Callable[[int], str]   # token id -> its text, for logprobs


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True)
class ResponseHeader:
    """What every body and chunk of one response shares."""
    id: str
    model: str
    kind: str                       # "completion" | "chat"
    created: int = field(default_factory=lambda: int(time.time()))

    def base(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def completion_choice(text: str, finish_reason: Optional[str],
                      logprobs: Optional[dict[str, Any]] = None, index: int = 0) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_message_choice(text: Optional[str], finish_reason: Optional[str],
                        logprobs: Optional[dict[str, Any]] = None, index: int = 0,
                        tool_calls: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """`tool_calls` (wire/tools.py's ToolCall.as_message) when the model called tools; its
    content is then null unless it also wrote text."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_delta_choice(delta: dict[str, Any], finish_reason: Optional[str],
                      logprobs: Optional[dict[str, Any]] = None, index: int = 0) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def full_response(header: ResponseHeader, text: str, finish_reason: Optional[str],
                  usage: dict[str, Any], metrics: Optional[dict[str, float]],
                  logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    choice = (chat_message_choice if header.kind == "chat" else completion_choice)(
        text, finish_reason, logprobs)
    return response_of_choices(header, [choice], usage, metrics)


def response_of_choices(header: ResponseHeader, choices: list[dict[str, Any]],
                        usage: dict[str, Any],
                        metrics: Optional[dict[str, float]]) -> dict[str, Any]:
    """A whole body of several choices (n > 1, a batch of prompts), in index order."""
    body = {**header.base(chunk=False), "choices": choices, "usage": usage}
    if metrics is not None:
        body["metrics"] = metrics
    return body


def chunk(header: ResponseHeader, choice: Optional[dict[str, Any]],
          usage: Optional[dict[str, Any]] = None,
          metrics: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """One SSE chunk; `choice=None` makes the final usage-only chunk (choices: [])."""
    body = {**header.base(chunk=True), "choices": [choice] if choice else []}
    if usage is not None:
        body["usage"] = usage
    if metrics is not None:
        body["metrics"] = metrics
    return body


# ---------------------------------------------------------------- logprobs

def completion_logprobs(entries: list[TokenLogprobs], token_ids: list[int],
                        token_text: TokenText, text_offset: int) -> dict[str, Any]:
    """Legacy completions format: parallel lists, text offsets into the completion."""
    tokens = [token_text(t) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [chosen for chosen, _ in entries],
        "top_logprobs": [{token_text(t): lp for t, lp in top} for _, top in entries],
        "text_offset": offsets,
    }


def chat_logprobs(entries: list[TokenLogprobs], token_ids: list[int],
                  token_text: TokenText) -> dict[str, Any]:
    """Chat format: one object per token with its bytes and its top alternatives."""
    return {"content": [
        {**_chat_token(token_text(t), chosen),
         "top_logprobs": [_chat_token(token_text(alt), lp) for alt, lp in top]}
        for t, (chosen, top) in zip(token_ids, entries)
    ]}


def _chat_token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
