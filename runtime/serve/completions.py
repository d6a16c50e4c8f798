"""The whole path of one completion or chat request through a replica, route to engine and back.

`OpenAIServing.create(request, request_id, receive)` takes a request that
wire's parser has already validated (fields, without the model) and answers it:

1. `_adapter`: the name the client asked for is the one served, or a loaded adapter's,
   which the request then runs with (404 otherwise);
2. `_prompt_token_ids`: tokenize the prompt, or render and tokenize the chat (with its
   tools: runtime/serve/tool_prompt.py);
   `GenerationRequest.max_tokens_within` is the one max_tokens rule;
3. `_start`: hand it to the engine-core process (`EngineClient.add_samples`), where
   `LLMEngine.add_request` checks what needs the model: token ids against the
   vocabulary, the prompt against the context and the KV cache (a 400);
4. `Generation`: the engine's token deltas as text (incremental detokenizer,
   stop strings, usage, metrics); `close()` aborts the request if unfinished;
5. `_full_response`: one JSON body, raced against the client leaving (499), or
   `_events`: SSE chunks, then usage, then [DONE], streamed by wire's
   `EventStreamResponse`, which closes the generation when the client leaves; an
   engine that dies mid-stream ends it with an error event and no [DONE].

A refusal before the engine holds the request is a `ProtocolError` for the
route to answer; from then on every outcome is a response made here.
Completions and chat differ only in the shape of a choice; a chat offered tools has its
text parsed into tool calls (runtime/serve/tool_calls.py), whole or streamed. A completion's batch of
prompts, and n samples of each, are several choices (runtime/serve/choices.py).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncGenerator, AsyncIterator, Container, Optional, Sequence, Union

from starlette.responses import JSONResponse, Response

from runtime.serve.engine_client import EngineClient
from runtime.serve.request_streams import EngineDead, RequestStream
from runtime.serve.choices import Choice, close_all, merged, per_prompt, total_usage
from runtime.core.detokenizer import IncrementalDetokenizer
from runtime.serve.metrics import ServerMetrics
from runtime.engine.outputs import RequestMetrics
from runtime.core.tokenizer import Tokenizer
from runtime.serve.tool_calls import ToolCallParser, finish_reason, parse_tool_calls
from runtime.serve.tool_prompt import encode_chat
from wire.disconnect import until_disconnect
from wire.errors import ProtocolError, error_body
from wire.priority import replica_priority
from wire.request_id import Receive
from wire.requests import GenerationRequest
from wire.responses import (ResponseHeader, TokenLogprobs, chat_delta_choice, chat_logprobs,
                            chat_message_choice, chunk, completion_choice, completion_logprobs,
                            response_of_choices, usage_dict)
from wire.sse import SSE_DONE, EventStreamResponse, sse

ID_PREFIX = {"completion": "cmpl", "chat": "chatcmpl"}   # the response id: PREFIX-<request id>


class OpenAIServing:
    """Answers /v1/completions and /v1/chat/completions for the one loaded model."""

    def __init__(self, served_model_name: str, engine: EngineClient, tokenizer: Tokenizer,
                 max_model_len: int, metrics: ServerMetrics, adapters: Container[str] = frozenset()):
        self.served_model_name = served_model_name
        self.adapters = adapters             # the names of the adapters loaded (runtime/serve/adapters.py)
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len   # the context, capped by the KV cache
        self.metrics = metrics

    async def create(self, request: GenerationRequest, request_id: str,
                     receive: Receive) -> Union[Response, EventStreamResponse]:
        """The response, or the stream, for one parsed request; ProtocolError on refusal.

        `request_id` (the X-Request-Id) becomes the engine's id, with a suffix when one is
        already in flight; `receive` is the client's, to notice it leaving."""
        lora = self._adapter(request)
        prompts = [self._prompt_token_ids(one) for one in per_prompt(request)]
        request = request.with_max_tokens(request.max_tokens_within(
            self.max_model_len, max(len(ids) for ids in prompts)))
        choices = await self._start_all(request, request_id, prompts, lora)
        header = ResponseHeader(id=f"{ID_PREFIX[request.kind]}-{choices[0].generation.request_id}",
                                model=lora or self.served_model_name, kind=request.kind)
        if request.stream:
            return EventStreamResponse(self._events(header, request, choices),
                                       on_close=lambda completed: close_all(choices))
        return await self._full_response(header, request, choices, receive)

    # ---------------------------------------------------------- before the engine

    def _adapter(self, request: GenerationRequest) -> Optional[str]:
        """The adapter the request's model names, None for the base; 404 for any other name."""
        if request.model is None or request.model == self.served_model_name:
            return None
        if request.model in self.adapters:
            return request.model
        raise ProtocolError(f"model: the model `{request.model}` does not exist (this replica "
                            f"serves `{self.served_model_name}` and its loaded adapters)", param="model",
                            status=404, code="model_not_found")

    def _prompt_token_ids(self, request: GenerationRequest) -> list[int]:
        if request.kind == "chat":
            try:
                return encode_chat(self.tokenizer, request.messages or [], request.tools)
            except ValueError as exc:   # no chat template, or the template refused the messages
                raise ProtocolError.from_value_error(exc) from None
        if isinstance(request.prompt, str):
            return self.tokenizer.encode(request.prompt)
        return list(request.prompt or [])   # checked against the vocabulary by the engine

    async def _start_all(self, request: GenerationRequest, request_id: str,
                         prompts: list[list[int]], lora: Optional[str]) -> list[Choice]:
        """Every prompt's n samples in the engine, as choices numbered prompt_i * n + j;
        if the engine refuses one prompt, those already started are aborted."""
        choices: list[Choice] = []
        try:
            for ids in prompts:
                echo = self.tokenizer.decode(ids) if request.echo else ""
                for generation in await self._start(request, request_id, ids, lora):
                    choices.append(Choice(len(choices), generation, echo))
        except BaseException:
            await close_all(choices)
            raise
        return choices

    async def _start(self, request: GenerationRequest, request_id: str, prompt_ids: list[int],
                     lora: Optional[str]) -> list["Generation"]:
        try:
            streams = await self.engine.add_samples(request_id, prompt_ids, request.params, lora,
                                                    priority=replica_priority(request.priority))
        except ValueError as exc:   # the engine's refusal names the field
            raise ProtocolError.from_value_error(exc) from None
        # samples after the first share the prompt's blocks: its tokens are counted once
        return [Generation(self.tokenizer, self.metrics, stream, len(prompt_ids),
                           request.params.stop, shares_prompt=j > 0)
                for j, stream in enumerate(streams)]

    # ---------------------------------------------------------- the answer

    async def _full_response(self, header: ResponseHeader, request: GenerationRequest,
                             choices: list[Choice], receive: Receive) -> Response:
        try:
            body = await until_disconnect(receive, self._full_body(header, request, choices))
        except EngineDead as exc:
            return JSONResponse(error_body(str(exc), 500), status_code=500)
        finally:
            await close_all(choices)
        if body is None:   # the client left; nobody reads this
            return Response(status_code=499)
        return JSONResponse(body)

    async def _full_body(self, header: ResponseHeader, request: GenerationRequest,
                         choices: list[Choice]) -> dict[str, Any]:
        """Every choice's deltas gathered into one body (its usage: their sum)."""
        collected = await asyncio.gather(*(self._collect(c) for c in choices))
        bodies = [self._choice_body(header.kind, request, c, got)
                  for c, got in zip(choices, collected)]
        first = collected[0].last
        assert first is not None
        metrics = first.metrics.as_dict() if first.metrics else None
        return response_of_choices(header, bodies, total_usage([g.usage for g in collected]),
                                   metrics)

    async def _collect(self, choice: Choice) -> "_Collected":
        got = _Collected(text=choice.echo)
        async for delta in choice.generation.deltas():
            got.add(delta)
        assert got.last is not None   # the engine's last delta always comes (or EngineDead)
        return got

    def _choice_body(self, kind: str, request: GenerationRequest, choice: Choice,
                     got: "_Collected") -> dict[str, Any]:
        assert got.last is not None
        logprobs = self._logprobs(kind, got.logprobs, got.token_ids, 0) \
            if request.logprobs is not None else None
        tools = request.offered_tools
        if kind == "chat" and tools is not None:
            parsed = parse_tool_calls(got.text, tools.forced)
            return chat_message_choice(parsed.message_content,
                                       finish_reason(got.last.finish_reason, bool(parsed.calls)),
                                       logprobs, index=choice.index,
                                       tool_calls=[c.as_message() for c in parsed.calls])
        make = chat_message_choice if kind == "chat" else completion_choice
        return make(got.text, got.last.finish_reason, logprobs, index=choice.index)

    async def _events(self, header: ResponseHeader, request: GenerationRequest,
                      choices: list[Choice]) -> AsyncGenerator[bytes, None]:
        """One chunk per delta of any choice, then usage, then [DONE]; an error event and no
        [DONE] if the engine died (so the gateway bills the stream as cut, not complete)."""
        options = request.stream_options
        usages: list[Optional[dict[str, Any]]] = [
            usage_dict(c.generation.num_prompt_tokens, 0, 0) for c in choices]
        for c in choices:
            first = self._first_chunk(header, c, total_usage(usages)
                                      if options.continuous_usage_stats else None)
            if first is not None:
                yield sse(first)
        offsets, last = [len(c.echo) for c in choices], None
        tools = request.offered_tools
        parsers = [ToolCallParser(tools.forced) for _ in choices] if tools else []
        try:
            async for c, delta in merged(choices):
                if parsers:   # the text as content and tool calls
                    delta = _with_tool_calls(parsers[c.index], delta)
                if c.index == 0:
                    last = delta
                usages[c.index] = delta.usage
                logprobs = None
                if request.logprobs is not None and delta.logprobs:
                    logprobs = self._logprobs(header.kind, delta.logprobs, delta.token_ids,
                                              offsets[c.index])
                offsets[c.index] += len(delta.text)
                if not (delta.text or delta.finish_reason or logprobs or delta.tool_calls):
                    continue   # held back by the detokenizer (partial character, possible stop)
                usage = total_usage(usages) if options.continuous_usage_stats else None
                yield sse(chunk(header, _delta_choice(header.kind, delta, logprobs, c.index), usage))
        except EngineDead as exc:   # headers are gone already: say it in the stream, and
            yield sse(error_body(str(exc), 500))   # no [DONE]: the answer did not complete
            return
        if options.include_usage and last is not None:
            yield sse(chunk(header, None, total_usage(usages),
                            last.metrics.as_dict() if last.metrics else None))
        yield SSE_DONE

    @staticmethod
    def _first_chunk(header: ResponseHeader, choice: Choice,
                     usage: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """A chat's role comes first, alone, as OpenAI sends it; an echoed prompt too."""
        if header.kind == "chat":
            return chunk(header, chat_delta_choice({"role": "assistant", "content": ""}, None,
                                                   index=choice.index), usage)
        if choice.echo:
            return chunk(header, completion_choice(choice.echo, None, index=choice.index), usage)
        return None

    def _logprobs(self, kind: str, entries: list[TokenLogprobs], token_ids: list[int],
                  offset: int) -> dict[str, Any]:
        entries = entries[:len(token_ids)]
        if kind == "chat":
            return chat_logprobs(entries, token_ids, self._token_text)
        return completion_logprobs(entries, token_ids, self._token_text, offset)

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def _delta_choice(kind: str, delta: "TextDelta",
                  logprobs: Optional[dict[str, Any]], index: int = 0) -> dict[str, Any]:
    if kind == "chat":
        content: dict[str, Any] = {"content": delta.text} if delta.text else {}
        if delta.tool_calls:
            content["tool_calls"] = delta.tool_calls
        return chat_delta_choice(content, delta.finish_reason, logprobs, index=index)
    return completion_choice(delta.text, delta.finish_reason, logprobs, index=index)


def _with_tool_calls(parser: ToolCallParser, delta: "TextDelta") -> "TextDelta":
    """A delta's text through the choice's tool-call parser (flushed at the last delta)."""
    parsed = parser.push(delta.text)
    if delta.finish_reason is not None:
        parsed += parser.finish()
    return replace(delta, text=parsed.content, tool_calls=[c.as_delta() for c in parsed.calls],
                   finish_reason=finish_reason(delta.finish_reason, parser.called))


# ---------------------------------------------------------------- one request as text

@dataclass
class TextDelta:
    text: str
    token_ids: list[int]
    logprobs: Optional[list[TokenLogprobs]]
    finish_reason: Optional[str]
    usage: dict[str, Any]                      # cumulative
    metrics: Optional[RequestMetrics] = None   # set on the last delta
    tool_calls: list[dict[str, Any]] = field(default_factory=list)   # chat with tools: whole calls


class Generation:
    """One request in the engine, seen as text. `close()` (always called) aborts it if
    unfinished and records it in the metrics."""

    def __init__(self, tokenizer: Tokenizer, metrics: ServerMetrics, stream: RequestStream,
                 num_prompt_tokens: int, stop: Optional[Sequence[str]], shares_prompt: bool = False):
        self.request_id = stream.request_id   # the engine's id: X-Request-Id, deduped
        # a sample after the first (n > 1) reuses the prompt's blocks: it bills no prompt
        self.num_prompt_tokens = 0 if shares_prompt else num_prompt_tokens
        self._shares_prompt = shares_prompt
        self._stream, self._metrics = stream, metrics
        self._detok = IncrementalDetokenizer(tokenizer, stop)
        self._count = 0
        self._reason: Optional[str] = None
        self._final_metrics: Optional[RequestMetrics] = None
        self._closed = False

    async def deltas(self) -> AsyncIterator[TextDelta]:
        gaps, detok = _Gaps(), self._detok
        async for out in self._stream:
            self._metrics.observe_token_gaps(gaps.tick(len(out.new_token_ids)))
            self._count += len(out.new_token_ids)
            text = detok.push(out.new_token_ids)
            reason = "stop" if detok.stopped else (out.finish_reason if out.finished else None)
            final = out
            if detok.stopped and not out.finished:
                # A stop string: end it in the engine, whose last output has the metrics.
                final = await self._stream.cancel()
            if reason is not None:
                text += detok.flush()
                self._reason, self._final_metrics = reason, final.metrics
            yield TextDelta(text, out.new_token_ids, out.new_logprobs, reason,
                            usage_dict(self.num_prompt_tokens, self._count,
                                       0 if self._shares_prompt else final.num_cached_tokens),
                            self._final_metrics)
            if reason is not None:
                return

    async def close(self) -> None:   # async: EventStreamResponse awaits its on_close
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        self._metrics.observe_finished(self._reason or "abort", self.num_prompt_tokens,
                                       self._count, self._final_metrics)


@dataclass
class _Gaps:
    """Inter-token latency: the gap before each token that arrives after the first."""
    last: Optional[float] = None

    def tick(self, num_tokens: int) -> list[float]:
        if not num_tokens:
            return []
        now = time.monotonic()
        gap, self.last = (None if self.last is None else now - self.last), now
        # Several tokens in one delta (speculative decoding) share the gap.
        return [] if gap is None else [gap / num_tokens] * num_tokens


@dataclass
class _Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    last: Optional[TextDelta] = None

    @property
    def usage(self) -> Optional[dict[str, Any]]:
        return self.last.usage if self.last is not None else None

    def add(self, delta: TextDelta) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        self.last = delta
