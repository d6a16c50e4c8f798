"""The OpenAI wire format as seen by the gateway: pure functions over dicts."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

from controlplane.errors import ApiError

PREFIX_CHARS = 512
DEFAULT_MAX_TOKENS = {"completions": 16, "chat/completions": 256}


@dataclass(frozen=True)
class ClientStreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


def check_request(body: Any, endpoint: str) -> None:
    """What the gateway needs to route; the replica validates the rest by name."""
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object", param="body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ApiError(400, "model: the deployment name is required", param="model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ApiError(400, "stream: must be true or false", param="stream")
    if endpoint == "chat/completions":
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise ApiError(400, "messages: must be a non-empty list", param="messages")
    elif "prompt" not in body:
        raise ApiError(400, "prompt: is required", param="prompt")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options: must be an object", param="stream_options")


def prompt_text(body: dict, endpoint: str) -> str:
    if endpoint == "chat/completions":
        return "\n".join(f"{m.get('role', '')}: {_content_text(m.get('content'))}"
                         for m in body["messages"] if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return " ".join(str(p) for p in prompt)
    return str(prompt)


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def prefix_key(text: str) -> str:
    """A cheap hash of the prompt's head, so the pool can route to a warm prefix cache."""
    return hashlib.blake2b(text[:PREFIX_CHARS].encode(), digest_size=8).hexdigest()


def estimate_prompt_tokens(text: str) -> int:
    return len(text) // 4 + 1


def requested_max_tokens(body: dict, endpoint: str) -> int:
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_MAX_TOKENS[endpoint]


def client_stream_options(body: dict) -> ClientStreamOptions:
    options = body.get("stream_options") or {}
    return ClientStreamOptions(bool(options.get("include_usage")),
                               bool(options.get("continuous_usage_stats")))


def upstream_body(body: dict) -> dict:
    """The client's body for the replica: no `model` (the replica serves one), and
    always cumulative usage in every chunk when streaming, so a cut stream is billable."""
    out = {k: v for k, v in body.items() if k != "model"}
    if out.get("stream"):
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return out


def client_chunk(chunk: dict, model: str, options: ClientStreamOptions) -> Optional[dict]:
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


def client_response(body: dict, model: str) -> dict:
    body = {k: v for k, v in body.items() if k != "metrics"}
    body["model"] = model
    return body


@dataclass
class UsageSeen:
    """Cumulative usage as the replica reported it so far."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finished: bool = False
    replica_metrics: Optional[dict] = None

    def observe(self, payload: dict) -> None:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)
        if isinstance(payload.get("metrics"), dict):
            self.replica_metrics = payload["metrics"]
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.finished = True


def has_content(payload: dict) -> bool:
    for choice in payload.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False
