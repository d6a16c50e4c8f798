"""OpenAI tool calling on chat completions: `tools`, `tool_choice`, tool messages, tool calls.

Parsed and checked here, at the control plane and again in the replica, so a bad shape
is a 400 naming the field before any replica thaws:
- `tools`: `[{"type": "function", "function": {"name", "description", "parameters",
  "strict"}}]`, names unique, each `parameters` a valid JSON schema;
- `tool_choice`: `"none"`, `"auto"` (the default when tools are given), `"required"`, or
  `{"type": "function", "function": {"name": ...}}` naming one of the tools;
- `parallel_tool_calls`: false allows at most one call under `required`;
- assistant messages' `tool_calls` and `tool` messages' `tool_call_id`, kept on the
  message for the chat template (arguments as an object, which is what templates expect).

`required` and a named choice are enforced with the structured-output grammar
(`forced_output`): the model writes `{"name": ..., "arguments": {...}}` (named), or a
non-empty array of them (required), and the grammar makes it valid JSON for the
function's parameters. The replica renders the tools (runtime/serve/tool_prompt.py) and
parses the calls out of the text (runtime/serve/tool_calls.py); `ToolCall` is their wire shape.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from wire.errors import ProtocolError
from wire.json_input import TooDeep, loads, too_deep
from wire.response_format import StructuredOutput, check_json_schema, json_schema_output

FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for a function name
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    description: Optional[str]
    parameters: dict[str, Any]

    def as_template_tool(self) -> dict[str, Any]:
        """The shape chat templates (Qwen, Llama 3, Hermes) iterate over as `tools`."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Tools:
    """The request's tools and how the model may use them: `choice` is "none", "auto",
    "required" or "function" (then `named` is the one function it must call)."""
    functions: tuple[Function, ...]
    choice: str
    parallel: bool = True
    named: Optional[str] = None

    @property
    def offered(self) -> bool:
        """Rendered into the prompt and parsed out of the output (not with "none")."""
        return self.choice != "none" and bool(self.functions)

    @property
    def forced(self) -> bool:
        """The output is a call, enforced by the grammar."""
        return self.choice in ("required", "function")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made; `arguments` is JSON text, as OpenAI sends it."""
    index: int
    id: str
    name: str
    arguments: str

    def as_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    def as_delta(self) -> dict[str, Any]:
        """A whole call in one stream delta: the client's accumulation gives the same call."""
        return {"index": self.index, **self.as_message()}


# ---------------------------------------------------------------- the request's tools

def parse_tools(body: dict[str, Any]) -> Optional[Tools]:
    """The request's tools, or None when it has none (and no tool_choice needing them)."""
    raw = body.get("tools")
    functions = _parse_functions(raw) if raw is not None else ()
    choice, named = _parse_choice(body.get("tool_choice"), functions)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ProtocolError("parallel_tool_calls: must be a boolean", param="parallel_tool_calls")
    if not functions:
        return None
    return Tools(functions, choice, parallel is not False, named)


def _parse_functions(raw: Any) -> tuple[Function, ...]:
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("tools: must be a non-empty list", param="tools")
    functions = tuple(_parse_function(i, tool) for i, tool in enumerate(raw))
    names = [f.name for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ProtocolError(f"tools[{i}].function.name: duplicate name {name!r}", param="tools")
    return functions


def _parse_function(index: int, tool: Any) -> Function:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ProtocolError(f"{where}: must be an object with type \"function\"", param="tools")
    spec = tool.get("function")
    if not isinstance(spec, dict):
        raise ProtocolError(f"{where}.function: must be an object", param="tools")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProtocolError(f"{where}.function.name: must be 1-64 letters, digits, _ or -", param="tools")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise ProtocolError(f"{where}.function.description: must be a string", param="tools")
    if spec.get("strict") is not None and not isinstance(spec.get("strict"), bool):
        raise ProtocolError(f"{where}.function.strict: must be a boolean", param="tools")
    parameters = spec.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise ProtocolError(f"{where}.function.parameters: must be a JSON schema object", param="tools")
    try:
        check_json_schema(f"{where}.function.parameters", parameters)
    except ProtocolError as exc:
        raise ProtocolError(exc.message, param="tools") from None
    return Function(name, description, parameters)


def _parse_choice(raw: Any, functions: tuple[Function, ...]) -> tuple[str, Optional[str]]:
    """(mode, the named function or None)."""
    if raw is None:
        return ("auto" if functions else "none"), None
    if isinstance(raw, str) and raw in ("none", "auto", "required"):
        choice, named = raw, None
    else:
        choice, named = "function", _named_choice(raw)
    if choice != "none" and not functions:
        raise ProtocolError("tool_choice: only allowed when tools are given", param="tool_choice")
    if named is not None and named not in {f.name for f in functions}:
        raise ProtocolError(f"tool_choice.function.name: no tool named {named!r}", param="tool_choice")
    return choice, named


def _named_choice(raw: Any) -> str:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not (isinstance(raw, dict) and raw.get("type") == "function" and isinstance(function, dict)
            and isinstance(function.get("name"), str)):
        raise ProtocolError('tool_choice: must be none, auto, required or {"type": "function", '
                            '"function": {"name": ...}}', param="tool_choice")
    return str(function["name"])


def forced_output(tools: Tools) -> StructuredOutput:
    """The grammar of a required or named call: the function's name, then arguments valid
    for its parameters (required: a non-empty array of such calls, any of the tools)."""
    calls = [_call_schema(f) for f in tools.functions]
    if tools.choice == "function":
        schema = next(c for c, f in zip(calls, tools.functions) if f.name == tools.named)
    else:
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not tools.parallel:
            schema["maxItems"] = 1
    return json_schema_output(schema, field="tool_choice")


def _call_schema(function: Function) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": function.name},
                                             "arguments": function.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


# ---------------------------------------------------------------- messages

def message_tool_fields(where: str, role: str, message: dict[str, Any]) -> dict[str, Any]:
    """What a message carries beyond role and content: an assistant's `tool_calls`, a tool
    result's `tool_call_id` (and `name`), checked, in the shape templates read."""
    extra: dict[str, Any] = {}
    if role == "assistant" and message.get("tool_calls") is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise ProtocolError(f"{where}.tool_calls: must be a list", param="messages")
        extra["tool_calls"] = [_message_call(f"{where}.tool_calls[{i}]", c) for i, c in enumerate(calls)]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise ProtocolError(f"{where}.tool_call_id: must be a string", param="messages")
        extra["tool_call_id"] = call_id
    if isinstance(message.get("name"), str):
        extra["name"] = message["name"]
    return extra


def _message_call(where: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str) and isinstance(call.get("id"), str)):
        raise ProtocolError(f'{where}: must be {{"id", "type": "function", "function": {{"name", '
                            f'"arguments"}}}} with strings', param="messages")
    return {"id": call["id"], "type": "function",
            "function": {"name": function["name"],
                         "arguments": _arguments(f"{where}.function.arguments", function["arguments"])}}


def _arguments(where: str, text: str) -> Any:
    """Templates write arguments with `tojson`: an object, not JSON text quoted again. Text
    that is not a JSON object (a model's broken call, sent back) stays as it is; JSON
    nested too deep for a template to walk is refused."""
    try:
        value = loads(text)
    except TooDeep:
        raise too_deep(where, param="messages") from None
    except ValueError:
        return text
    return value if isinstance(value, dict) else text
