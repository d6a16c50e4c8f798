"""The whole path of one /v1/embeddings request through a replica of task "embed".

`EmbeddingServing.create(request, request_id, receive)`: the model name (404 for
another), each input tokenized (strings) or taken as token ids, every input handed
to the engine as one prefill-only request (the scheduler batches them with the
others; the runner pools instead of sampling, runtime/engine/pooling.py), the vectors
gathered in input order, raced against the client leaving (499). Usage: the input
tokens, summed; nothing is generated.
"""
from __future__ import annotations

import asyncio
from typing import Optional

from starlette.responses import JSONResponse, Response

from runtime.serve.engine_client import EngineClient
from runtime.serve.request_streams import EngineDead, RequestStream
from runtime.serve.metrics import ServerMetrics
from runtime.core.tokenizer import Tokenizer
from wire.disconnect import until_disconnect
from wire.embeddings import EmbeddingRequest, embedding_response
from wire.errors import ProtocolError, error_body
from wire.priority import replica_priority
from wire.request_id import Receive
from wire.sampling import SamplingParams

PREFILL_ONLY = SamplingParams(max_tokens=1)   # an embedding request samples nothing


class EmbeddingServing:
    def __init__(self, served_model_name: str, engine: EngineClient, tokenizer: Tokenizer,
                 metrics: ServerMetrics):
        self.served_model_name = served_model_name
        self.engine = engine
        self.tokenizer = tokenizer
        self.metrics = metrics

    async def create(self, request: EmbeddingRequest, request_id: str,
                     receive: Receive) -> Response:
        """The response; ProtocolError when the model name or an input is refused."""
        if request.model is not None and request.model != self.served_model_name:
            raise ProtocolError(f"model: the model `{request.model}` does not exist (this replica "
                                f"serves `{self.served_model_name}`)", param="model", status=404,
                                code="model_not_found")
        inputs = [self.tokenizer.encode(p) if isinstance(p, str) else list(p)
                  for p in request.inputs]
        streams = await self._start(request_id, inputs, replica_priority(request.priority))
        try:
            vectors = await until_disconnect(receive, asyncio.gather(
                *(self._vector(s, len(ids)) for s, ids in zip(streams, inputs))))
        except EngineDead as exc:
            return JSONResponse(error_body(str(exc), 500), status_code=500)
        finally:
            for stream in streams:
                stream.close()
        if vectors is None:   # the client left; nobody reads this
            return Response(status_code=499)
        return JSONResponse(embedding_response(self.served_model_name, list(vectors),
                                               request.encoding_format,
                                               sum(len(ids) for ids in inputs)))

    async def _start(self, request_id: str, inputs: list[list[int]], priority: int) -> list[RequestStream]:
        streams: list[RequestStream] = []
        try:
            for ids in inputs:
                streams.append(await self.engine.add(request_id, ids, PREFILL_ONLY, priority))
        except ValueError as exc:   # the engine's refusal names the field
            for stream in streams:
                stream.close()
            raise ProtocolError.from_value_error(exc, {"prompt": "input"}) from None
        return streams

    async def _vector(self, stream: RequestStream, num_tokens: int) -> list[float]:
        vector: Optional[list[float]] = None
        async for out in stream:
            vector = out.embedding
            if out.finished:
                self.metrics.observe_finished(out.finish_reason or "stop", num_tokens, 0,
                                              out.metrics)
        assert vector is not None, "an embedding engine answers every request with its vector"
        return vector
