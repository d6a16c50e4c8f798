"""Tools into the prompt: through the model's chat template when it takes `tools`, else a system prompt.

The templates of tool-calling models (Qwen 2.5 and 3, Llama 3.1+, Hermes) read `tools`,
assistant messages' `tool_calls` and `tool` messages themselves, in the format the model
was trained on, so they get them as they are. A template that never mentions `tools`
would drop them silently; for it the tools are written into the system message in the
Hermes format (which runtime/serve/tool_calls.py parses), and earlier calls and their results
become text it can show (`<tool_call>` in the assistant's turn, `<tool_response>` in a
user turn, as Qwen's template writes them).
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Optional, Protocol, Sequence

from wire.tools import Function, Tools

SYSTEM_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


class ChatTemplate(Protocol):
    """What rendering needs of runtime.core.tokenizer.Tokenizer."""
    chat_template: Optional[str]

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **extra: Any) -> list[int]: ...


def encode_chat(tokenizer: ChatTemplate, messages: list[dict[str, Any]], tools: Optional[Tools]) -> list[int]:
    """The chat's prompt token ids, with the tools offered when the request offers them
    (not with tool_choice "none": then the model answers in text)."""
    functions = tools.functions if tools is not None and tools.offered else ()
    if takes_tools(tokenizer.chat_template):
        extra = {"tools": [f.as_template_tool() for f in functions]} if functions else {}
        return tokenizer.encode_chat(messages, True, **extra)
    return tokenizer.encode_chat(plain_messages(messages, functions), True)


@lru_cache(maxsize=16)
def takes_tools(template: Optional[str]) -> bool:
    """Whether the template reads a `tools` variable (parsed once per template)."""
    if template is None:
        return False
    from jinja2 import Environment, meta

    env = Environment(extensions=["jinja2.ext.loopcontrols"])
    return "tools" in meta.find_undeclared_variables(env.parse(template))


def plain_messages(messages: list[dict[str, Any]], functions: Sequence[Function]) -> list[dict[str, Any]]:
    """Messages for a template that knows only role and content."""
    plain = [_plain(m) for m in messages]
    if not functions:
        return plain
    tools_text = SYSTEM_PROMPT.format(tools="\n".join(json.dumps(f.as_template_tool()) for f in functions))
    if plain and plain[0]["role"] == "system":
        return [{"role": "system", "content": f"{plain[0]['content']}\n\n{tools_text}"}, *plain[1:]]
    return [{"role": "system", "content": tools_text}, *plain]


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    calls = [f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}"
             "\n</tool_call>" for c in message.get("tool_calls", [])]
    return {"role": message["role"], "content": "\n".join(filter(None, [message["content"], *calls]))}
