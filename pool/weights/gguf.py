"""A deployment whose model_uri names one `.gguf` object (s3://bucket/path/model.gguf).

At deploy, `inspect_gguf` reads the object's header with ranged GETs (spec/gguf.py) and
describes it as the model folder it imports to (spec/gguf_model.py: architecture by its
Hugging Face class, every tensor named and shaped, the tokenizer kind); a file the
importer would refuse is a ModelUnavailable (422) here already.

On a cold start, WeightStore (pool/weights/store.py) fetches the object into the cache like any
weight file and imports it with `run_import`: `python -m runtime.gguf.importer` in a process
of its own (the pool runs no model code, and imports neither numpy nor torch), into a
cache entry of its own keyed by the object's ETag (`imported_key`), so the next cold
start of the same object, on any revision, finds the folder there.
"""
from __future__ import annotations

import asyncio
import hashlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from pool.api import ColdStartFailed, ModelInfo, ModelUnavailable
from pool.weights.inspection import Retry, pins_of, read_range
from pool.s3 import MISSING_CODES, S3Client, S3Object, error_code, origin_prefix
from spec import gguf as spec_gguf
from spec.gguf_layouts import kept_bytes, kept_quantized, widened
from spec.gguf import GGUFError, GGUFHeader, TensorInfo, Truncated, parse_header
from spec.gguf_model import IMPORT_FORMAT, describe

FIRST_READ = 4 << 20                 # most headers (vocabulary included) fit in the first 4 MiB


def is_gguf_uri(model_uri: str) -> bool:
    return model_uri.endswith(".gguf")


def object_of(model_uri: str) -> tuple[str, str]:
    """s3://bucket/path/model.gguf -> (bucket, "path/model.gguf")."""
    bucket, _, key = model_uri.removeprefix("s3://").partition("/")
    if not model_uri.startswith("s3://") or not bucket or not key:
        raise ModelUnavailable(f"model_uri: expected s3://bucket/path/model.gguf, got {model_uri!r}")
    return bucket, key


async def head(client: S3Client, model_uri: str) -> S3Object:
    bucket, key = object_of(model_uri)
    try:
        resp = await client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:  # noqa: BLE001 - a missing object is the caller's error
        if error_code(exc) in MISSING_CODES:
            raise ModelUnavailable(f"missing object {model_uri}") from exc
        raise
    return S3Object(bucket, key, int(resp["ContentLength"]), str(resp["ETag"]).strip('"'))


async def inspect_gguf(client: S3Client, model_uri: str, retry: Retry) -> ModelInfo:
    """ModelInfo of the folder the object imports to; ModelUnavailable naming what is wrong."""
    obj = await retry(lambda: head(client, model_uri))
    try:
        header = await read_gguf_header(client, obj, retry)
        config, tensors = await asyncio.to_thread(describe, header)
    except GGUFError as exc:
        raise ModelUnavailable(f"bad GGUF {model_uri}: {exc}") from exc
    params = sum(info.num_elements for _, info in tensors)
    kept = [info for _, info in tensors if kept_quantized(info)]
    quantized_params = sum(info.num_elements for info in kept)
    quantized_bytes = sum(kept_bytes(info) for info in kept)
    widened = (params - quantized_params) * 4
    return ModelInfo(
        model_uri=model_uri, architecture=config["architectures"][0], weight_bytes=quantized_bytes + widened,
        dtype="float32", num_parameters=params, files=(obj.key.rsplit("/", 1)[-1],),
        linear_parameters=sum(info.num_elements for name, info in tensors if name.endswith("_proj.weight")),
        quantized_parameters=quantized_params, quantized_bytes=quantized_bytes,
        quantization=weights_format(tensors),
        bytes_by_dtype={"float32": widened}, num_hidden_layers=config["num_hidden_layers"],
        num_key_value_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
        max_position_embeddings=config["max_position_embeddings"],
        num_attention_heads=config["num_attention_heads"], vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
        objects=pins_of([obj]))


def weights_format(tensors: list[tuple[str, TensorInfo]]) -> dict[str, Any]:
    """What the deployment shows: the quantized types kept and how many tensors of each,
    and the (Hugging Face) names of the quantized tensors the import widens to floats."""
    kept = Counter(info.type_name for _, info in tensors if kept_quantized(info))
    wide = [name for name, info in tensors if widened(info)]
    return {"format": "gguf", "kept": dict(sorted(kept.items())), "widened": wide} if kept or wide else {}


async def read_gguf_header(client: S3Client, obj: S3Object, retry: Retry) -> GGUFHeader:
    """The header, read in growing ranges from the start of the object while it goes on,
    never past spec.gguf's header cap (a header that would go past it is a GGUFError). It
    is parsed in a thread: a header of millions of values keeps the event loop serving."""
    buf = b""
    want = min(FIRST_READ, obj.size, spec_gguf.HEADER_MAX_BYTES)
    while True:
        if want > len(buf):
            buf += await read_range(client, obj, retry, len(buf), want - 1)
        try:
            return await asyncio.to_thread(parse_header, buf, obj.size)
        except Truncated as short:      # never once buf is the whole object: then a GGUFError
            want = min(obj.size, spec_gguf.HEADER_MAX_BYTES, max(short.needed, 2 * len(buf)))


def imported_key(obj: S3Object) -> str:
    """The cache entry of the folder imported from obj (its bytes named by the ETag)."""
    name = origin_prefix(obj) + f"{obj.bucket}/{obj.key}/{obj.etag}#gguf-import-{IMPORT_FORMAT}"
    return hashlib.sha256(name.encode()).hexdigest()[:40]


async def run_import(gguf_path: Path, out_dir: Path, uri: str) -> None:
    """`python -m runtime.gguf.importer` into out_dir; ColdStartFailed with its reason."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtime.gguf.importer", str(gguf_path), str(out_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await proc.communicate()
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"]
        raise ColdStartFailed(f"importing {uri} failed: {lines[-1]}")
