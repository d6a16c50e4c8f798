"""OpenAI Responses API requests (`POST /v1/responses`): parsed, checked, and translated
into the chat completion the gateway already serves.

The Responses API is another surface over the same generation: `input` (a string, or a
list of messages and function-call items), `instructions` (a system message that is not
carried to the next turn), `max_output_tokens`, function `tools` written flat (`{"type":
"function", "name", "parameters"}`), `text.format` in place of `response_format`. Each
becomes its chat field here, so tools and structured output run through wire/tools.py and
wire/response_format.py exactly as for chat, and the replica sees a chat completion. A
bad shape is a ProtocolError naming the Responses field (`input`, `tools`, `text.format`)
before any replica thaws; `renamed` puts the client's names on what the chat rules refuse.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from wire.errors import ProtocolError

FIELDS = frozenset({"model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
                    "stream", "previous_response_id", "store", "tools", "tool_choice",
                    "parallel_tool_calls", "text", "metadata", "user", "truncation"})
ROLES = frozenset({"user", "assistant", "system", "developer"})
TEXT_PARTS = frozenset({"input_text", "output_text"})
MAX_METADATA = 16                 # OpenAI's limits on metadata
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
# chat fields that Responses fields became: a refusal by the chat rules names the client's
RENAMED = (("response_format.json_schema.schema", "text.format.schema"),
           ("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"),
           ("messages", "input"))
Message = dict[str, Any]


@dataclass(frozen=True)
class ResponsesRequest:
    """One parsed Responses request. `messages` is this turn's input as chat messages;
    `chat_fields` the sampling, tools and format as chat names them; `echo` what the
    response object repeats of the request, in the Responses API's own shapes."""
    model: str
    messages: tuple[Message, ...]
    instructions: Optional[str] = None
    stream: bool = False
    store: bool = True
    previous_response_id: Optional[str] = None
    chat_fields: dict[str, Any] = field(default_factory=dict)
    echo: dict[str, Any] = field(default_factory=dict)

    def chat_body(self, history: Sequence[Message] = ()) -> dict[str, Any]:
        """The chat completion of this turn: the instructions, the earlier turns (the
        conversation `previous_response_id` continues), then this input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return {"model": self.model, "messages": [*system, *history, *self.messages],
                "stream": self.stream, **self.chat_fields}


def parse_responses_request(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise ProtocolError("body: must be a JSON object", param="body")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise ProtocolError(f"{unknown[0]}: unknown field", param=unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("model: the deployment name is required", param="model")
    _check_truncation(body.get("truncation"))
    chat = {**_sampling(body), **_tools(body), **_text_format(body.get("text"))}
    return ResponsesRequest(
        model=model, messages=tuple(input_messages(body.get("input"))),
        instructions=_optional(body, "instructions", str), stream=_optional(body, "stream", bool) or False,
        store=_optional(body, "store", bool) is not False,
        previous_response_id=_optional(body, "previous_response_id", str),
        chat_fields=chat, echo=_echo(body))


def renamed(exc: ProtocolError) -> ProtocolError:
    """A refusal by the chat rules, with the Responses API's name of the field."""
    message, param = exc.message, exc.param
    for chat, ours in RENAMED:
        message = message.replace(chat, ours)
        if param == chat:
            param = ours
    return ProtocolError(message, param=param, status=exc.status, code=exc.code)


# ---------------------------------------------------------------- input

def input_messages(raw: Any) -> list[Message]:
    """`input` as chat messages: a string is one user message; a list holds messages
    (text parts only), `function_call` items (an assistant's tool calls, consecutive
    ones in one message) and `function_call_output` items (tool messages)."""
    if isinstance(raw, str) and raw:
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("input: must be a non-empty string or a non-empty list of items", param="input")
    messages: list[Message] = []
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{where}: must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(where, item))
        elif kind == "function_call":
            _append_call(messages, _function_call(where, item))
        elif kind == "function_call_output":
            messages.append(_call_output(where, item))
        else:
            raise ProtocolError(f"{where}.type: {kind!r} is not supported (message, function_call, "
                                "function_call_output)", param="input")
    return messages


def _message(where: str, item: dict[str, Any]) -> Message:
    role = item.get("role")
    if role not in ROLES:
        raise ProtocolError(f"{where}.role: must be one of {sorted(ROLES)}", param="input")
    return {"role": role, "content": _text(f"{where}.content", item.get("content"))}


def _text(where: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"{where}: must be a string or a list of text parts", param="input")
    texts = []
    for index, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
            raise ProtocolError(f"{where}[{index}]: only input_text and output_text parts are supported",
                                param="input")
        texts.append(part["text"])
    return "".join(texts)


def _function_call(where: str, item: dict[str, Any]) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise ProtocolError(f"{where}.{name}: must be a string", param="input")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _append_call(messages: list[Message], call: dict[str, Any]) -> None:
    """Calls made in one turn are one assistant message with several tool_calls."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _call_output(where: str, item: dict[str, Any]) -> Message:
    if not isinstance(item.get("call_id"), str):
        raise ProtocolError(f"{where}.call_id: must be a string", param="input")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": _text(f"{where}.output", item.get("output"))}


# ---------------------------------------------------------------- the rest

def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    chat = {name: body[name] for name in ("temperature", "top_p", "user", "parallel_tool_calls")
            if body.get(name) is not None}
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ProtocolError("max_output_tokens: must be an integer >= 1", param="max_output_tokens")
        chat["max_completion_tokens"] = max_tokens
    return chat


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """Function tools in chat's shape; wire/tools.py checks them (names, schemas, choice)."""
    chat: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ProtocolError("tools: must be a list", param="tools")
        if tools:       # the SDK may send an empty list: no tools
            chat["tools"] = [_tool(f"tools[{i}]", tool) for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise ProtocolError('tool_choice: must be none, auto, required or {"type": "function", "name": ...}',
                                param="tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        chat["tool_choice"] = choice
    return chat


def _tool(where: str, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ProtocolError(f"{where}.type: only function tools are supported", param="tools")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _text_format(text: Any) -> dict[str, Any]:
    """`text.format` as chat's `response_format`: text (none), json_object, json_schema."""
    if text is None:
        return {}
    if not isinstance(text, dict) or sorted(set(text) - {"format", "verbosity"}):
        raise ProtocolError("text: must be an object with format", param="text")
    form = text.get("format")
    if form is None:
        return {}
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind != "json_schema":
        raise ProtocolError("text.format.type: must be one of text, json_object, json_schema", param="text.format")
    assert isinstance(form, dict)
    if not isinstance(form.get("name"), str):
        raise ProtocolError("text.format.name: must be a string", param="text.format")
    spec = {k: form[k] for k in ("name", "schema", "strict", "description") if form.get(k) is not None}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}


def _check_truncation(value: Any) -> None:
    if value not in (None, "disabled"):
        raise ProtocolError('truncation: only "disabled" is supported (a conversation past the '
                            "context is refused)", param="truncation")


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise ProtocolError(f"metadata: must be an object of at most {MAX_METADATA} pairs", param="metadata")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(item, str) or len(item) > MAX_METADATA_VALUE:
            raise ProtocolError(f"metadata: keys of at most {MAX_METADATA_KEY} characters, values strings "
                                f"of at most {MAX_METADATA_VALUE}", param="metadata")
    return dict(value)


def _optional(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is str and isinstance(value, bool))):
        raise ProtocolError(f"{name}: must be a {'boolean' if kind is bool else 'string'}", param=name)
    return value


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the response object repeats it, OpenAI's defaults filled in."""
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "metadata": _metadata(body.get("metadata")), "store": body.get("store") is not False,
            "previous_response_id": body.get("previous_response_id"), "truncation": "disabled",
            "user": body.get("user")}
