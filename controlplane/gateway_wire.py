"""The OpenAI wire as the gateway sees it, beyond what `wire.requests` parses.

What it sends upstream (the client's body with cumulative usage in every chunk,
so a stream cut midway can still be billed), what it hands back (the
deployment's name as `model`, usage only as the client asked for it), the usage
seen so far, and the prompt estimates used to route and rate-limit before the
replica has tokenized anything.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

from wire.requests import GenerationRequest, StreamOptions

PREFIX_CHARS = 512


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


def upstream_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's body for the replica: no `model` (the replica serves one), and
    always cumulative usage in every chunk when streaming, so a cut stream is billable."""
    out = {k: v for k, v in body.items() if k != "model"}
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


@dataclass
class UsageSeen:
    """Cumulative usage as the replica reported it so far."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finished: bool = False          # a choice carried a finish_reason

    def observe(self, payload: dict[str, Any]) -> None:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.finished = True


def has_content(payload: dict[str, Any]) -> bool:
    for choice in payload.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False
