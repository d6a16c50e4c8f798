"""OpenAI completion and chat requests: parse and validate, for the edge and the replica.

Pure functions over dicts; no engine, no HTTP. The control plane parses every
request with these rules before it wakes a replica, and the replica parses it
again with the same rules (it can be used on its own, like `vllm serve`).
Every refusal is a `ProtocolError` naming the offending field, so the answer is
a 400 with `param` set. What needs the model (the vocabulary for token ids, the
context length for a chat's default max_tokens) is checked by the replica.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from wire.errors import ProtocolError
from wire.priority import FIELD as PRIORITY_FIELD
from wire.priority import parse_priority
from wire.response_format import FIELDS as STRUCTURED_OUTPUT_FIELDS
from wire.response_format import parse_structured_output
from wire.sampling import PROCESSOR_FIELDS, SamplingParams, processor_values
from wire.tools import FIELDS as TOOL_FIELDS
from wire.tools import Tools, forced_output, message_tool_fields, parse_tools

Prompt = Union[str, list[int]]

DEFAULT_COMPLETION_MAX_TOKENS = 16   # OpenAI's default for /v1/completions
MAX_LOGPROBS = 20

# Fields each endpoint understands; anything else is refused by name.
_SAMPLING_FIELDS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                    "stop_token_ids", "ignore_eos"} | PROCESSOR_FIELDS
_COMMON_FIELDS = (_SAMPLING_FIELDS | {"model", "stream", "stream_options", "user", PRIORITY_FIELD}
                  | STRUCTURED_OUTPUT_FIELDS)
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "logprobs", "echo"}
CHAT_FIELDS = _COMMON_FIELDS | {"messages", "logprobs", "top_logprobs", "max_completion_tokens"} | TOOL_FIELDS
CHAT_ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass(frozen=True)
class StreamOptions:
    include_usage: bool = False
    # vLLM's extension: cumulative usage in every chunk, so a stream cut midway can be billed.
    continuous_usage_stats: bool = False


@dataclass
class GenerationRequest:
    """One parsed /v1/completions or /v1/chat/completions request."""
    kind: str                                  # "completion" | "chat"
    params: SamplingParams
    prompt: Optional[Prompt] = None            # completions
    # chat: role and content flattened to text, plus tool_calls / tool_call_id (wire/tools.py)
    messages: Optional[list[dict[str, Any]]] = None
    model: Optional[str] = None
    stream: bool = False
    stream_options: StreamOptions = field(default_factory=StreamOptions)
    max_tokens_given: bool = True              # chat: False -> fill up to the context
    logprobs: Optional[int] = None             # top-N requested; None: no logprobs
    batch: list[Prompt] = field(default_factory=list)   # completions: every prompt when several
    echo: bool = False                         # completions: the prompt leads each choice's text
    tools: Optional[Tools] = None              # chat: tools and tool_choice (wire/tools.py)
    priority: Optional[int] = None             # wire/priority.py; None: the caller's default

    @property
    def prompts(self) -> list[Prompt]:
        """The prompts of a completion (one choice each, times n); [] for a chat."""
        if self.batch:
            return self.batch
        return [] if self.prompt is None else [self.prompt]

    @property
    def offered_tools(self) -> Optional[Tools]:
        """The tools the model is offered (not with tool_choice "none"): its output is parsed for calls."""
        return self.tools if self.tools is not None and self.tools.offered else None

    def max_tokens_within(self, context_len: int, prompt_len: int) -> int:
        """The one max_tokens rule: what the client asked for; a completion without it
        gets OpenAI's 16 (set at parse); a chat without it gets what the context leaves
        after the prompt (at least one token)."""
        if self.max_tokens_given:
            return self.params.max_tokens
        return max(1, context_len - prompt_len)

    def with_max_tokens(self, max_tokens: int) -> "GenerationRequest":
        return replace(self, params=replace(self.params, max_tokens=max_tokens))


# ---------------------------------------------------------------- parsing

def parse_completion_request(body: Any) -> GenerationRequest:
    body = _require_object(body)
    _refuse_unknown(body, COMPLETION_FIELDS)
    logprobs = _optional_int(body, "logprobs", 0, MAX_LOGPROBS)
    echo = _optional_bool(body, "echo")
    if echo and logprobs is not None:
        raise ProtocolError("echo: not supported together with logprobs", param="echo")
    max_tokens = body.get("max_tokens")
    params = _sampling_params(body, _or_default(max_tokens), logprobs)
    prompts = parse_prompts(body.get("prompt"))
    return GenerationRequest(
        kind="completion", params=params, prompt=prompts[0],
        batch=prompts if len(prompts) > 1 else [],
        model=_optional_str(body, "model"), stream=_optional_bool(body, "stream"),
        stream_options=_parse_stream_options(body), logprobs=logprobs, echo=echo,
        priority=parse_priority(body),
    )


def parse_chat_request(body: Any) -> GenerationRequest:
    body = _require_object(body)
    _refuse_unknown(body, CHAT_FIELDS)
    logprobs = _chat_logprobs(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    params = _sampling_params(body, _or_default(max_tokens), logprobs)
    tools = parse_tools(body)
    if tools is not None and tools.forced:   # required / named: the grammar makes it a call
        if params.structured_output is not None:
            raise ProtocolError(f"tool_choice: a required or named call cannot be combined with "
                                f"{params.structured_output.field}", param="tool_choice")
        params = replace(params, structured_output=forced_output(tools))
    return GenerationRequest(
        kind="chat", params=params, messages=_parse_messages(body.get("messages")),
        model=_optional_str(body, "model"), stream=_optional_bool(body, "stream"),
        stream_options=_parse_stream_options(body), max_tokens_given=max_tokens is not None,
        logprobs=logprobs, tools=tools, priority=parse_priority(body),
    )


def _or_default(max_tokens: Any) -> Any:
    return DEFAULT_COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    return body


def _refuse_unknown(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ProtocolError(f"{unknown[0]}: unknown field", param=unknown[0])


def _sampling_params(body: dict[str, Any], max_tokens: Any, logprobs: Optional[int]) -> SamplingParams:
    given = {k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None}
    try:
        given.update(processor_values(given))
    except ValueError as exc:
        raise ProtocolError.from_value_error(exc) from None
    given["max_tokens"] = max_tokens
    given["logprobs"] = logprobs
    given["structured_output"] = parse_structured_output(body)
    if "stop_token_ids" in given and not isinstance(given["stop_token_ids"], list):
        raise ProtocolError("stop_token_ids: must be a list of token ids", param="stop_token_ids")
    stop = given.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise ProtocolError("stop: must be a string or a list of strings", param="stop")
    if "ignore_eos" in given and not isinstance(given["ignore_eos"], bool):
        raise ProtocolError("ignore_eos: must be a boolean", param="ignore_eos")
    params = SamplingParams(**given)
    rename = {"max_tokens": "max_completion_tokens"} if "max_completion_tokens" in body else None
    if "top_logprobs" in body:
        rename = {**(rename or {}), "logprobs": "top_logprobs"}
    check_sampling_params(params, vocab_size=None, rename=rename)
    return params


def check_sampling_params(params: SamplingParams, vocab_size: Optional[int],
                          rename: Optional[dict[str, str]] = None) -> None:
    try:
        params.validate(vocab_size)
    except ValueError as exc:
        raise ProtocolError.from_value_error(exc, rename) from None


MAX_PROMPTS = 64   # one completions request: its prompts times n are engine requests


def parse_prompts(prompt: Any) -> list[Prompt]:
    """One prompt, or a batch of them (strings or token-id lists): one choice each."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise ProtocolError(f"prompt: at most {MAX_PROMPTS} prompts in one request",
                                param="prompt")
        return [_parse_prompt(p) for p in prompt]
    return [_parse_prompt(prompt)]


def _parse_prompt(prompt: Any) -> Prompt:
    if isinstance(prompt, str):
        if not prompt:
            raise ProtocolError("prompt: must not be empty", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(t < 0 for t in prompt):
            raise ProtocolError("prompt: token ids must be >= 0", param="prompt")
        return list(prompt)
    raise ProtocolError("prompt: must be a non-empty string or a list of token ids", param="prompt")


def _parse_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages: must be a non-empty list", param="messages")
    return [_parse_message(i, m) for i, m in enumerate(messages)]


def _parse_message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ProtocolError(f"{where}: must be an object", param="messages")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ProtocolError(f"{where}.role: must be one of {sorted(CHAT_ROLES)}", param="messages")
    return {"role": role, "content": _message_text(where, message.get("content")),
            **message_tool_fields(where, role, message)}


def _message_text(where: str, content: Any) -> str:
    """Content is a string or a list of text parts; other part types are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ProtocolError(f"{where}.content: only text parts are supported",
                                    param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise ProtocolError(f"{where}.content: must be a string or a list of text parts",
                        param="messages")


def _chat_logprobs(body: dict[str, Any]) -> Optional[int]:
    wanted = _optional_bool(body, "logprobs")
    top = _optional_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise ProtocolError("top_logprobs: requires logprobs=true", param="top_logprobs")
    return (top or 0) if wanted else None


def _parse_stream_options(body: dict[str, Any]) -> StreamOptions:
    options = body.get("stream_options")
    if options is None:
        return StreamOptions()
    if not isinstance(options, dict):
        raise ProtocolError("stream_options: must be an object", param="stream_options")
    if not body.get("stream"):
        raise ProtocolError("stream_options: only allowed with stream=true", param="stream_options")
    unknown = sorted(set(options) - {"include_usage", "continuous_usage_stats"})
    if unknown:
        raise ProtocolError(f"stream_options.{unknown[0]}: unknown field", param="stream_options")
    return StreamOptions(
        include_usage=_optional_bool(options, "include_usage", "stream_options.include_usage"),
        continuous_usage_stats=_optional_bool(options, "continuous_usage_stats",
                                              "stream_options.continuous_usage_stats"),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_bool(body: dict[str, Any], name: str, label: Optional[str] = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError(f"{label or name}: must be a boolean", param=label or name)
    return value


def _optional_str(body: dict[str, Any], name: str) -> Optional[str]:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{name}: must be a string", param=name)
    return value


def _optional_int(body: dict[str, Any], name: str, low: int, high: int) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise ProtocolError(f"{name}: must be an integer in [{low}, {high}]", param=name)
    return int(value)


ENDPOINTS = ("completions", "chat/completions", "embeddings")


def parse_request(endpoint: str, body: Any) -> GenerationRequest:
    """`endpoint` is the path after /v1/: "completions", "chat/completions" or "embeddings"
    (its inputs as prompts, for the gateway to estimate, route and bill)."""
    if endpoint == "chat/completions":
        return parse_chat_request(body)
    if endpoint == "completions":
        return parse_completion_request(body)
    if endpoint == "embeddings":
        from wire.embeddings import parse_embedding_request   # it builds on this module
        return parse_embedding_request(body).as_generation()
    raise ValueError(f"unknown endpoint {endpoint!r}")
