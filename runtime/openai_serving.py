"""Turns parsed OpenAI requests into engine requests and engine deltas into OpenAI bodies.

`Generation` is the one place that knows about text: it feeds token deltas
to the incremental detokenizer, ends the request on a stop string (aborting
it in the engine), and counts usage. `full_body` gathers its `TextDelta`s
into one JSON body, `sse_events` turns them into SSE chunks; completions and
chat differ only in the shape of a choice.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from runtime.async_engine import EngineDead, RequestStream
from runtime.detokenizer import IncrementalDetokenizer
from runtime.metrics import ServerMetrics
from runtime.model_host import LoadedModel
from runtime.outputs import RequestMetrics, TokenLogprobs
from runtime.protocol import (SSE_DONE, GenerationRequest, ProtocolError, ResponseHeader,
                              chat_delta_choice, chat_logprobs, check_sampling_params, chunk,
                              completion_choice, completion_logprobs, error_body, full_response,
                              sse, usage_dict)
from runtime.sampling_params import validate_prompt_ids


@dataclass
class PreparedRequest:
    """A request checked against the model, ready for the engine."""
    request: GenerationRequest
    prompt_token_ids: list[int]


@dataclass
class TextDelta:
    text: str
    token_ids: list[int]
    logprobs: Optional[list[TokenLogprobs]]
    finish_reason: Optional[str]
    usage: dict[str, Any]                      # cumulative
    metrics: Optional[RequestMetrics] = None   # set on the last delta


def prepare(model: LoadedModel, request: GenerationRequest) -> PreparedRequest:
    """Tokenize and check everything that needs the model; ProtocolError on refusal."""
    prompt_ids = _prompt_token_ids(model, request)
    if not request.max_tokens_given:
        # Chat without max_tokens: as much as the context leaves (at least one token).
        request = request.with_max_tokens(max(1, model.max_model_len - len(prompt_ids)))
    check_sampling_params(request.params, model.vocab_size)
    return PreparedRequest(request, prompt_ids)


def _prompt_token_ids(model: LoadedModel, request: GenerationRequest) -> list[int]:
    if request.kind == "chat":
        try:
            return model.tokenizer.encode_chat(request.messages, add_generation_prompt=True)
        except ValueError as exc:   # no chat template, or the template refused the messages
            raise ProtocolError.from_value_error(exc) from None
    if isinstance(request.prompt, str):
        return model.tokenizer.encode(request.prompt)
    try:
        validate_prompt_ids(request.prompt, model.vocab_size)
    except ValueError as exc:
        raise ProtocolError.from_value_error(exc) from None
    return request.prompt


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


async def start(model: LoadedModel, metrics: ServerMetrics, request_id: str,
                prepared: PreparedRequest) -> "Generation":
    """Hand the request to the engine; ProtocolError if the engine refuses it (too long)."""
    try:
        stream = await model.engine.add(request_id, prepared.prompt_token_ids,
                                        prepared.request.params)
    except ValueError as exc:
        raise ProtocolError.from_value_error(exc) from None
    return Generation(model, metrics, stream, prepared)


class Generation:
    """One request in the engine, seen as text. `close()` (always called) aborts it if unfinished."""

    def __init__(self, model: LoadedModel, metrics: ServerMetrics, stream: RequestStream,
                 prepared: PreparedRequest):
        self.request_id = stream.request_id   # the engine's id: X-Request-Id, deduped
        self._stream, self._metrics, self._prepared = stream, metrics, prepared
        self._detok = IncrementalDetokenizer(model.tokenizer, prepared.request.params.stop)
        self._count, self._reason, self._final_metrics = 0, None, None
        self._closed = False

    async def deltas(self) -> AsyncIterator[TextDelta]:
        num_prompt, gaps, detok = len(self._prepared.prompt_token_ids), _Gaps(), self._detok
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
                            usage_dict(num_prompt, self._count, final.num_cached_tokens),
                            self._final_metrics)
            if reason is not None:
                return

    async def close(self) -> None:   # async so the server can await it like any cleanup
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        self._metrics.observe_finished(self._reason or "abort", len(self._prepared.prompt_token_ids),
                                       self._count, self._final_metrics)


# ---------------------------------------------------------------- shaping

def _token_text(model: LoadedModel):
    return lambda token_id: model.tokenizer.decode([token_id])


@dataclass
class _Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    last: Optional[TextDelta] = None


async def full_body(model: LoadedModel, header: ResponseHeader, prepared: PreparedRequest,
                    deltas: AsyncIterator[TextDelta]) -> dict[str, Any]:
    """The non-streaming response: every delta gathered into one body."""
    got = _Collected()
    async for delta in deltas:
        got.text += delta.text
        got.token_ids += delta.token_ids
        got.logprobs += delta.logprobs or []
        got.last = delta
    logprobs = _logprobs(model, header.kind, got.logprobs, got.token_ids, 0) \
        if prepared.request.logprobs is not None else None
    metrics = got.last.metrics.as_dict() if got.last.metrics else None
    return full_response(header, got.text, got.last.finish_reason, got.last.usage, metrics,
                         logprobs)


def _logprobs(model: LoadedModel, kind: str, entries: list[TokenLogprobs],
              token_ids: list[int], offset: int) -> dict[str, Any]:
    token_text = _token_text(model)
    entries = entries[:len(token_ids)]
    if kind == "chat":
        return chat_logprobs(entries, token_ids, token_text)
    return completion_logprobs(entries, token_ids, token_text, offset)


async def sse_events(model: LoadedModel, header: ResponseHeader, prepared: PreparedRequest,
                     deltas: AsyncIterator[TextDelta]) -> AsyncIterator[bytes]:
    """The streaming response: one chunk per delta, then usage, then [DONE]."""
    request = prepared.request
    options = request.stream_options
    if header.kind == "chat":
        # The role comes first, alone, as OpenAI sends it.
        first_usage = usage_dict(len(prepared.prompt_token_ids), 0, 0) \
            if options.continuous_usage_stats else None
        yield sse(chunk(header, chat_delta_choice({"role": "assistant", "content": ""}, None),
                        first_usage))
    offset, last = 0, None
    try:
        async for delta in deltas:
            last = delta
            logprobs = None
            if request.logprobs is not None and delta.logprobs:
                logprobs = _logprobs(model, header.kind, delta.logprobs, delta.token_ids, offset)
            offset += len(delta.text)
            if not (delta.text or delta.finish_reason or logprobs):
                continue   # held back by the detokenizer (partial character, possible stop string)
            usage = delta.usage if options.continuous_usage_stats else None
            yield sse(chunk(header, _delta_choice(header.kind, delta, logprobs), usage))
    except EngineDead as exc:   # headers are gone already: say it in the stream
        yield sse(error_body(str(exc), 500, "server_error"))
        yield SSE_DONE
        return
    if options.include_usage and last is not None:
        yield sse(chunk(header, None, last.usage, last.metrics.as_dict() if last.metrics else None))
    yield SSE_DONE


def _delta_choice(kind: str, delta: TextDelta, logprobs: Optional[dict[str, Any]]):
    if kind == "chat":
        content = {"content": delta.text} if delta.text else {}
        return chat_delta_choice(content, delta.finish_reason, logprobs)
    return completion_choice(delta.text, delta.finish_reason, logprobs)
