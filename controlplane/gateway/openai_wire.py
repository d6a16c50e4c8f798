"""The OpenAI wire as the gateway sees it, beyond what `wire.requests` parses.

What it sends upstream (the client's body with cumulative usage in every chunk,
so a stream cut midway can still be billed), what it hands back (the
deployment's name as `model`, usage only as the client asked for it), the usage
seen so far, and the prompt estimates used to route and rate-limit before the
replica has tokenized anything.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from wire.priority import FIELD as PRIORITY_FIELD
from wire.priority import INTERACTIVE_PRIORITY
from wire.requests import GenerationRequest, StreamOptions

PREFIX_CHARS = 512
# The special tokens a template may put around one prompt (BOS, the generation prompt),
# beyond what its text accounts for: for the bound a budget reserves.
SPECIAL_TOKENS_PER_PROMPT = 16


def prompt_text(request: GenerationRequest) -> str:
    """The prompt as one string: chat messages as `role: content` lines."""
    if request.messages is not None:
        return "\n".join(f"{m['role']}: {m['content']}" for m in request.messages)
    return "\n".join(p if isinstance(p, str) else " ".join(map(str, p)) for p in request.prompts)


def prefix_key(text: str) -> str:
    """A cheap hash of the prompt's head, so the pool can route to a warm prefix cache."""
    return hashlib.blake2b(text[:PREFIX_CHARS].encode(), digest_size=8).hexdigest()


def estimate_prompt_tokens(request: GenerationRequest, text: str) -> int:
    """Exact for token ids; about four characters a token for text."""
    if request.prompts and all(isinstance(p, list) for p in request.prompts):
        return sum(len(p) for p in request.prompts)
    return len(text) // 4 + 1


def prompt_token_bound(request: GenerationRequest, body: dict[str, Any]) -> int:
    """At least the prompt tokens a replica will count, as far as text can say, for what a
    budget reserves: exact for token ids; a text's UTF-8 bytes (a token of a byte-level or
    byte-fallback vocabulary holds at least one byte); a chat's messages and tools as JSON
    (its keys and quotes stand for the template's role markers); each with room for the
    special tokens around a prompt."""
    if request.messages is not None:
        chat = json.dumps([body.get("messages"), body.get("tools")], ensure_ascii=False)
        return len(chat.encode()) + SPECIAL_TOKENS_PER_PROMPT
    return sum(len(p) if isinstance(p, list) else len(p.encode()) + SPECIAL_TOKENS_PER_PROMPT
               for p in request.prompts)


def upstream_body(body: dict[str, Any], adapter: Optional[str] = None,
                  priority: int = INTERACTIVE_PRIORITY) -> dict[str, Any]:
    """The client's body for the replica: no `model` (the replica serves one) but the
    replica's name of the adapter it runs with, the priority the call was resolved to
    (its key's default when it named none), and always cumulative usage in every chunk
    when streaming, so a cut stream is billable."""
    out = {k: v for k, v in body.items() if k != "model"}
    out[PRIORITY_FIELD] = priority
    if adapter is not None:
        out["model"] = adapter
    if out.get("stream"):
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return out


def client_chunk(chunk: dict[str, Any], model: str,
                 options: StreamOptions) -> Optional[dict[str, Any]]:
    """A replica chunk as the client asked for it; None drops it."""
    chunk = {k: v for k, v in chunk.items() if k != "metrics"}
    chunk["model"] = model
    usage_only = not chunk.get("choices")
    if not options.include_usage:
        if usage_only and "usage" in chunk:
            return None
        chunk.pop("usage", None)
    elif not options.continuous_usage_stats and not usage_only:
        chunk["usage"] = None          # OpenAI's shape: null until the final chunk
    return chunk


def client_response(body: dict[str, Any], model: str) -> dict[str, Any]:
    body = {k: v for k, v in body.items() if k != "metrics"}
    body["model"] = model
    return body


MAX_TOKENS = 2 ** 31 - 1       # a count a usage row may hold, whatever a replica says


def token_count(value: Any, limit: int) -> Optional[int]:
    """A replica's token count as billed: an int (not a bool) from 0, at most `limit`;
    None for anything else (a string, a float, NaN, a negative number)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return min(value, limit)


@dataclass
class UsageSeen:
    """Cumulative usage as the replica reported it so far, bounded: each count at most
    what the request could have used (`prompt_limit`, `completion_limit`: the context
    per prompt and per choice). A usage the gateway cannot take (wrong types, negative,
    missing counts) is not taken; without any well-formed one the call is billed by the
    gateway's own counts (`fall_back`)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finished: bool = False          # a choice carried a finish_reason
    prompt_limit: int = MAX_TOKENS
    completion_limit: int = MAX_TOKENS
    estimated_prompt: int = 0       # the gateway's estimate of the prompt
    counted_completion: int = 0     # the gateway's count: chunks delivered, or the answer's text
    reported: bool = False          # a well-formed usage arrived
    malformed: bool = False         # a usage arrived that was not

    def observe(self, payload: dict[str, Any]) -> None:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._take(usage)
        elif usage is not None:
            self.malformed = True
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.finished = True

    def _take(self, usage: dict[str, Any]) -> None:
        prompt = token_count(usage.get("prompt_tokens"), self.prompt_limit)
        # an embedding's usage has no completion_tokens (OpenAI's shape): none written
        completion = token_count(usage.get("completion_tokens", 0), self.completion_limit)
        details = usage.get("prompt_tokens_details") or {}
        cached = token_count((details.get("cached_tokens") or 0) if isinstance(details, dict) else None,
                             prompt or 0)
        if prompt is None or completion is None or cached is None:
            self.malformed = True
            return
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = prompt, completion, cached
        self.reported = True

    def fall_back(self) -> None:
        """No well-formed usage came: bill the gateway's own counts instead."""
        if not self.reported:
            self.prompt_tokens = min(self.estimated_prompt, self.prompt_limit)
            self.completion_tokens = min(self.counted_completion, self.completion_limit)
            self.cached_tokens = 0

    def as_openai(self) -> dict[str, Any]:
        """The counts as OpenAI's `usage`: what the client sees in place of a malformed one."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def estimate_completion_tokens(payload: dict[str, Any]) -> int:
    """A unary answer's tokens, counted from its text (about four characters a token),
    for a replica whose usage cannot be taken."""
    choices = payload.get("choices")
    texts = [_text_of(choice) for choice in (choices if isinstance(choices, list) else ())]
    return sum(len(text) // 4 + 1 for text in texts if text is not None)


def _text_of(choice: Any) -> Optional[str]:
    """A completion choice's text, or a chat choice's message content."""
    if not isinstance(choice, dict):
        return None
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


def has_content(payload: dict[str, Any]) -> bool:
    choices = payload.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if choice.get("text") or (isinstance(delta, dict) and delta.get("content")):
            return True
    return False
