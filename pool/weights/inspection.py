"""inspect_model: architecture and weight sizes from S3 without downloading weights.

Reads config.json and, per safetensors file, the 8-byte header length and the
JSON header with ranged GETs; sums bytes and parameters per dtype. A `.gguf`
object's header is read by pool/weights/gguf.py; a folder with `thawpool.toml` is a
function package (inspect_function).
"""
from __future__ import annotations

import asyncio
import json
import math
import struct
from collections import Counter
from dataclasses import asdict, replace
from typing import Any, Awaitable, Callable, Iterable, Protocol, TypeVar

from pool.api import FUNCTION_ARCHITECTURE, ModelInfo, ModelUnavailable, PinnedObject, Pins
from pool.s3 import (DENIED_CODES, MISMATCH_CODES, MISSING_CODES, S3Client, S3Object, error_code,
                     list_objects, parse_uri)
from spec.function_package import MANIFEST
from spec.quantization_config import QuantizationScheme, loaded_bytes, scheme

FUNCTION_MANIFEST = MANIFEST              # a function package's marker: the file the replica reads
HEAD_GUESS = 64 * 1024
# A model's small files are read whole at deploy time; past these sizes they are not
# a model folder's files but an attempt to make the control plane read gigabytes.
JSON_MAX_BYTES = 1024 * 1024                # config.json, model.safetensors.index.json
# The safetensors headers of all shards together, each length checked before it is read
# (a 400B-parameter model's come to a few MiB), and the number of shards: each costs a GET
# while the deploy holds its tenant's lock.
HEADERS_MAX_BYTES = 64 * 1024 * 1024
MAX_SHARDS = 1024
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}
T = TypeVar("T")


class Retry(Protocol):
    """Runs an S3 call, again if it fails transiently (WeightStore.retry)."""
    async def __call__(self, call: Callable[[], Awaitable[T]]) -> T: ...


async def plain(call: Callable[[], Awaitable[T]]) -> T:
    """A Retry that tries once."""
    return await call()


async def inspect_model(client: S3Client, model_uri: str, retry: Retry = plain) -> ModelInfo:
    if model_uri.endswith(".gguf"):                 # one GGUF object, not a folder
        from pool.weights.gguf import inspect_gguf

        return await inspect_gguf(client, model_uri, retry)
    bucket, prefix = parse_uri(model_uri)
    objects = {o.key[len(prefix):]: o for o in await retry(lambda: listing(client, bucket, prefix))}
    if FUNCTION_MANIFEST in objects:                # a function package, not a model folder
        return await inspect_function(client, model_uri, objects, retry)
    if "config.json" not in objects:
        raise ModelUnavailable(f"missing object s3://{bucket}/{prefix}config.json")
    config = await read_json(client, objects["config.json"], retry)
    quantization = quantization_of(config, objects["config.json"])
    shards = await weight_files(client, objects, retry, f"s3://{bucket}/{prefix}")
    headers = await read_headers(client, [objects[name] for name in shards], retry)
    try:    # a header of a million tensors is seconds of CPU: off the event loop
        info = await asyncio.to_thread(summarize, model_uri, config, shards, headers, quantization)
        return replace(info, objects=pins_of(objects.values()))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelUnavailable(f"bad safetensors header under {model_uri}: a tensor entry "
                               f"without a valid dtype, shape or data_offsets ({exc!r})") from exc


def quantization_of(config: dict[str, Any], obj: S3Object) -> QuantizationScheme | None:
    """The checkpoint's quantization, refused here (a 422 naming the field) when the
    runtime cannot serve it, before any replica tries to load it."""
    try:
        return scheme(config)
    except ValueError as exc:
        raise ModelUnavailable(f"{obj.uri}: {exc}") from exc


async def listing(client: S3Client, bucket: str, prefix: str) -> list[S3Object]:
    """The objects under the prefix; ModelUnavailable when the bucket is missing or the
    credentials it is read with (the platform's, or a tenant grant's) may not list it."""
    try:
        return await list_objects(client, bucket, prefix)
    except Exception as exc:  # noqa: BLE001 - classified below, the rest propagates
        code = error_code(exc)
        if code in MISSING_CODES:
            raise ModelUnavailable(f"missing bucket s3://{bucket}/") from exc
        if code in DENIED_CODES:
            raise ModelUnavailable(f"s3://{bucket}/{prefix} cannot be read with the credentials "
                                   f"its model source grants ({code})") from exc
        raise


async def inspect_function(client: S3Client, model_uri: str, objects: dict[str, S3Object],
                           retry: Retry) -> ModelInfo:
    """A function package: its manifest's text (the control plane parses it) and the
    size of every file, which the pool pulls whole."""
    manifest = objects[FUNCTION_MANIFEST]
    if manifest.size > JSON_MAX_BYTES:
        raise ModelUnavailable(f"{manifest.uri} is {manifest.size} bytes, over the {JSON_MAX_BYTES}-byte cap")
    text = (await read_range(client, manifest, retry)).decode("utf-8", "replace")
    return ModelInfo(model_uri=model_uri, architecture=FUNCTION_ARCHITECTURE,
                     weight_bytes=sum(o.size for o in objects.values()), dtype="none",
                     num_parameters=0, files=tuple(sorted(objects)), function_manifest=text,
                     objects=pins_of(objects.values()))


def pins_of(objects: Iterable[S3Object]) -> Pins:
    """The objects as read now, for the revision to keep."""
    return {o.uri: PinnedObject(o.etag, o.size) for o in objects}


async def weight_files(client: S3Client, objects: dict[str, S3Object], retry: Retry, where: str) -> list[str]:
    """The safetensors files the model loads, each checked to exist."""
    if "model.safetensors.index.json" in objects:
        index = await read_json(client, objects["model.safetensors.index.json"], retry)
        names = sorted(set(index.get("weight_map", {}).values()))
    else:
        names = sorted(n for n in objects if n.endswith(".safetensors"))
    if not names:
        raise ModelUnavailable(f"missing object {where}model.safetensors (no *.safetensors under the prefix)")
    if len(names) > MAX_SHARDS:
        raise ModelUnavailable(f"{where}: {len(names)} weight files, over the cap of {MAX_SHARDS}")
    for name in names:
        if name not in objects:
            raise ModelUnavailable(f"missing object {where}{name} (listed in the index)")
    return names


async def read_range(client: S3Client, obj: S3Object, retry: Retry, start: int = 0,
                     end: int | None = None) -> bytes:
    rng = f"bytes={start}-{'' if end is None else end}"

    async def call() -> bytes:
        try:        # the bytes listed, and pinned by the revision, or none
            resp = await client.get_object(Bucket=obj.bucket, Key=obj.key, Range=rng, IfMatch=f'"{obj.etag}"')
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) in MISSING_CODES:
                raise ModelUnavailable(f"missing object {obj.uri}") from exc
            if error_code(exc) in MISMATCH_CODES:
                raise ModelUnavailable(f"{obj.uri} changed while it was read (ETag no longer "
                                       f"{obj.etag}): deploy again") from exc
            raise
        async with resp["Body"] as body:
            data: bytes = await body.read()
            return data
    return await retry(call)


async def read_json(client: S3Client, obj: S3Object, retry: Retry) -> dict[str, Any]:
    """A small JSON object file, capped; ModelUnavailable (422) when too big or not an object."""
    if obj.size > JSON_MAX_BYTES:
        raise ModelUnavailable(f"{obj.uri} is {obj.size} bytes, over the {JSON_MAX_BYTES}-byte cap")
    try:
        value = json.loads(await read_range(client, obj, retry))
    except ValueError as exc:
        raise ModelUnavailable(f"{obj.uri} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelUnavailable(f"{obj.uri} is not a JSON object")
    return value


async def read_headers(client: S3Client, shards: list[S3Object], retry: Retry) -> list[dict[str, Any]]:
    """Every shard's header, together at most HEADERS_MAX_BYTES."""
    left = HEADERS_MAX_BYTES
    headers = []
    for obj in shards:
        raw = await read_header(client, obj, retry, left)
        left -= len(raw)
        headers.append(await asyncio.to_thread(parse_header, obj, raw))
    return headers


async def read_header(client: S3Client, obj: S3Object, retry: Retry, most: int) -> bytes:
    """The JSON header's bytes; its declared length is checked (within the file, at most
    `most` bytes) before they are read."""
    if obj.size < 8:
        raise ModelUnavailable(f"bad safetensors file {obj.uri}: {obj.size} bytes")
    head = await read_range(client, obj, retry, 0, min(obj.size, HEAD_GUESS) - 1)
    (length,) = struct.unpack("<Q", head[:8])
    if length + 8 > obj.size:
        raise ModelUnavailable(f"bad safetensors header in {obj.uri}: length {length} runs past the file")
    if length > most:
        raise ModelUnavailable(f"safetensors header of {obj.uri}: {length} bytes, past what is left "
                               f"({most}) of the {HEADERS_MAX_BYTES}-byte cap on all shards' headers")
    raw = head[8:8 + length]
    if len(raw) < length:
        raw += await read_range(client, obj, retry, 8 + len(raw), 8 + length - 1)
    return raw


def parse_header(obj: S3Object, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ModelUnavailable(f"bad safetensors header in {obj.uri}: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelUnavailable(f"bad safetensors header in {obj.uri}: not a JSON object")
    return header


def summarize(model_uri: str, config: dict[str, Any], files: list[str], headers: list[dict[str, Any]],
              quantization: QuantizationScheme | None = None) -> ModelInfo:
    """quantization: the checkpoint's; its quantized weights keep their format as they
    load, counted at what the runtime's repacking makes of them."""
    by_dtype: Counter[str] = Counter()
    params = linear = quantized_params = quantized_bytes = 0
    for header in headers:
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = math.prod(entry["shape"])
            start, end = entry["data_offsets"]
            by_dtype[SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())] += end - start
            params += count
            loaded = loaded_bytes(quantization, name, entry["dtype"], entry["shape"]) if quantization else None
            if loaded is not None:
                quantized_params += count
                quantized_bytes += loaded
            elif name.endswith("_proj.weight") and len(entry["shape"]) == 2:
                linear += count
    heads = int(config.get("num_attention_heads") or 1)
    return ModelInfo(
        model_uri=model_uri,
        architecture=(config.get("architectures") or ["unknown"])[0],
        weight_bytes=sum(by_dtype.values()),
        dtype=by_dtype.most_common(1)[0][0] if by_dtype else str(config.get("torch_dtype", "float32")),
        num_parameters=params,
        files=tuple(files),
        linear_parameters=linear,
        quantized_parameters=quantized_params,
        quantized_bytes=quantized_bytes,
        quantization=asdict(quantization) | {"format": quantization.method} if quantization else {},
        bytes_by_dtype=dict(by_dtype),
        num_hidden_layers=int(config.get("num_hidden_layers") or 0),
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config.get("hidden_size", 0)) // heads),
        max_position_embeddings=int(config.get("max_position_embeddings") or 0),
        num_attention_heads=int(config.get("num_attention_heads") or 0),
        vocab_size=int(config.get("vocab_size") or 0),
        hidden_size=int(config.get("hidden_size") or 0),
        intermediate_size=int(config.get("intermediate_size") or 0),
    )
