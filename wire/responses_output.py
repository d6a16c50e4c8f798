"""OpenAI Responses API answers: the `response` object and its typed stream events, built
from the chat completion (or its chunks) that served the request.

A response's `output` is a list of items: a `message` with one `output_text` part for
what the model wrote, then a `function_call` item per tool call. Streamed, each item is
opened (`response.output_item.added`), filled (`response.output_text.delta`,
`response.function_call_arguments.delta`) and closed (`...done`, `response.output_item.done`)
in order, between `response.created`/`response.in_progress` and `response.completed`
(or `response.incomplete` when max_output_tokens cut it); every event carries its
`sequence_number`, as the official client's stream reader expects.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

Item = dict[str, Any]
Event = dict[str, Any]


def new_id(prefix: str) -> str:
    """`resp_...`, `msg_...`, `fc_...`: OpenAI's prefixes, 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """What was billed, in the Responses API's names."""
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(frozen=True)
class ResponseHead:
    """What every form of one response shares: its id, when it was made, the model (the
    deployment's name) and what it repeats of the request (wire.responses_request's echo)."""
    model: str
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[Item], usage: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "model": self.model,
                "status": status, "error": None, "incomplete_details": incomplete, "output": output,
                "usage": usage, **self.echo}


def status_of(finish_reason: Optional[str]) -> str:
    """A chat finish_reason as the response's status: cut by max tokens is incomplete."""
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(item_id: str, text: str, status: str) -> Item:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [] if status == "in_progress" else [text_part(text)]}


def text_part(text: str) -> Item:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Item:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_of(completion: dict[str, Any]) -> tuple[list[Item], Optional[str]]:
    """A whole chat completion's first choice as output items, and its finish_reason."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    items: list[Item] = []
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"], "completed"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append(function_call_item(new_id("fc"), str(call.get("id")), str(function.get("name")),
                                        str(function.get("arguments")), "completed"))
    return items, choice.get("finish_reason")


def conversation_of(output: list[Item]) -> list[dict[str, Any]]:
    """Output items as the chat messages that continue the conversation after them."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return [message]


class ResponseEvents:
    """The typed events of one streamed response, from the chat chunks that serve it:
    `opening`, then `chunk` for each chunk, then `closing` with the usage billed."""

    def __init__(self, head: ResponseHead):
        self.head = head
        self.output: list[Item] = []
        self.finish_reason: Optional[str] = None
        self._sequence = 0
        self._open: Optional[Item] = None        # the item being filled
        self._calls: dict[int, Item] = {}        # function_call items by the chat delta's index

    def opening(self) -> list[Event]:
        empty = self.head.body("in_progress", [])
        return [self._event("response.created", response=empty),
                self._event("response.in_progress", response=empty)]

    def chunk(self, payload: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def closing(self, usage: dict[str, Any]) -> tuple[list[Event], dict[str, Any]]:
        """The last events, and the response they complete (what is stored)."""
        events = self._close()
        status = status_of(self.finish_reason)
        response = self.head.body(status, self.output, usage)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=response)], response

    def error(self, body: dict[str, Any]) -> Event:
        """The stream broke off: an error event in the error body's words."""
        error = body.get("error") or {}
        return self._event("error", code=error.get("code"), message=error.get("message", "stream cut"),
                           param=error.get("param"))

    def _text(self, text: str) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if item is None or item["type"] != "message":
            events += self._close()
            item = self._add(message_item(new_id("msg"), "", "in_progress"), events)
            item["text"] = ""
            events.append(self._event("response.content_part.added", item_id=item["id"],
                                      output_index=item["index"], content_index=0, part=text_part("")))
        item["text"] += text
        return [*events, self._event("response.output_text.delta", item_id=item["id"], output_index=item["index"],
                                     content_index=0, delta=text, logprobs=[])]

    def _call(self, call: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        function = call.get("function") or {}
        item = self._calls.get(call.get("index", 0))
        if item is None:
            events += self._close()
            item = self._add(function_call_item(new_id("fc"), str(call.get("id")), str(function.get("name")),
                                                "", "in_progress"), events)
            self._calls[call.get("index", 0)] = item
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=item["index"], delta=arguments))
        return events

    def _add(self, item: Item, events: list[Event]) -> Item:
        """Opens an item (its `added` event onto `events`): the working copy, which also
        carries its index and, for a message, its text so far."""
        self._open = {**item, "index": len(self.output)}
        self.output.append(item)
        events.append(self._event("response.output_item.added", output_index=self._open["index"], item=item))
        return self._open

    def _close(self) -> list[Event]:
        """Closes the open item, if any: its done events, and its final form in `output`."""
        item, self._open = self._open, None
        if item is None:
            return []
        events: list[Event] = []
        index = item["index"]
        if item["type"] == "message":
            done = message_item(item["id"], item["text"], "completed")
            events += [self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=item["text"], logprobs=[]),
                       self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=text_part(item["text"]))]
        else:
            done = function_call_item(item["id"], item["call_id"], item["name"], item["arguments"], "completed")
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, name=item["name"], arguments=item["arguments"]))
        self.output[index] = done
        return [*events, self._event("response.output_item.done", output_index=index, item=done)]

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event
