"""OpenAI's /v1/embeddings: parse and validate a request, shape the answer (pure Python).

`input` is a string, a list of strings, a list of token ids or a list of such lists
(one vector each, in order). `encoding_format` "float" gives lists of numbers;
"base64" (what the official client asks for by default) the little-endian float32
bytes of each vector. Usage counts the input tokens only: an embedding is billed
per input token. The gateway sees the request as a `GenerationRequest` of kind
"embedding" (`as_generation`), so estimating, routing and metering stay one path.
"""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any, Optional, Union

from wire.errors import ProtocolError
from wire.priority import FIELD as PRIORITY_FIELD
from wire.priority import parse_priority
from wire.requests import GenerationRequest, Prompt, parse_prompts
from wire.responses import usage_dict
from wire.sampling import SamplingParams

EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user", PRIORITY_FIELD})
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: list[Prompt]
    model: Optional[str] = None
    encoding_format: str = "float"
    priority: Optional[int] = None             # wire/priority.py; None: the caller's default

    def as_generation(self) -> GenerationRequest:
        return GenerationRequest(kind="embedding", params=SamplingParams(max_tokens=1),
                                 prompt=self.inputs[0],
                                 batch=self.inputs if len(self.inputs) > 1 else [],
                                 model=self.model, priority=self.priority)


def parse_embedding_request(body: Any) -> EmbeddingRequest:
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    unknown = sorted(set(body) - EMBEDDING_FIELDS)
    if unknown:
        raise ProtocolError(f"{unknown[0]}: unknown field", param=unknown[0])
    if body.get("dimensions") is not None:
        raise ProtocolError("dimensions: not supported (the model's hidden size is returned)",
                            param="dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise ProtocolError(f"encoding_format: must be one of {', '.join(ENCODINGS)}",
                            param="encoding_format")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ProtocolError("model: must be a string", param="model")
    return EmbeddingRequest(_parse_inputs(body.get("input")), model, encoding, parse_priority(body))


def _parse_inputs(value: Any) -> list[Prompt]:
    try:
        return parse_prompts(value)
    except ProtocolError as exc:   # the same rules as a completion's prompt, named `input`
        raise ProtocolError("input" + exc.message[len("prompt"):], param="input") from None


def encode_vector(vector: list[float], encoding: str) -> Union[list[float], str]:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def embedding_response(model: str, vectors: list[list[float]], encoding: str,
                       prompt_tokens: int) -> dict[str, Any]:
    usage = usage_dict(prompt_tokens, 0, 0)
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encode_vector(v, encoding)}
                     for i, v in enumerate(vectors)],
            "usage": {k: usage[k] for k in ("prompt_tokens", "total_tokens")}}
