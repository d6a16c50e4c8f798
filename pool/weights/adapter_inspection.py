"""inspect_adapter: a PEFT LoRA adapter's two files from S3, read as far as its checks need.

adapter_config.json is read whole, but never past spec.lora_adapter.MAX_CONFIG_BYTES + 1
bytes (one more than a config may have, so the rule that refuses a larger one still sees
it is larger); adapter_model.safetensors with a ranged GET for its 8-byte header length,
then, when that length is one a header may have inside the file, a second for the header.
Nothing here judges what it read: the rules (spec.lora_adapter) need the base the adapter
attaches to, which the control plane knows. Reads are pinned to the ETags listed, like a
model's (pool.weights.inspection.read_range).
"""
from __future__ import annotations

from pool.api import AdapterInfo, ModelUnavailable
from pool.s3 import S3Client, S3Object, parse_uri
from pool.weights.inspection import Retry, listing, pins_of, plain, read_range
from spec.lora_adapter import CONFIG_FILE, MAX_CONFIG_BYTES, WEIGHTS_FILE, header_length

LENGTH_BYTES = 8                     # a safetensors file starts with its header's length


async def inspect_adapter(client: S3Client, adapter_uri: str, retry: Retry = plain) -> AdapterInfo:
    bucket, prefix = parse_uri(adapter_uri)
    listed = {o.key[len(prefix):]: o for o in await retry(lambda: listing(client, bucket, prefix))}
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if name not in listed:
            raise ModelUnavailable(f"{name}: missing (no object s3://{bucket}/{prefix}{name})")
    config, weights = listed[CONFIG_FILE], listed[WEIGHTS_FILE]
    return AdapterInfo(adapter_uri=adapter_uri, config=await _config(client, config, retry),
                       header=await _header(client, weights, retry), weight_bytes=weights.size,
                       objects=pins_of([config, weights]))


async def _config(client: S3Client, obj: S3Object, retry: Retry) -> bytes:
    if obj.size == 0:
        return b""                   # a ranged GET of an empty object is refused (416)
    return await read_range(client, obj, retry, 0, min(obj.size, MAX_CONFIG_BYTES + 1) - 1)


async def _header(client: S3Client, obj: S3Object, retry: Retry) -> bytes:
    """The length, and the header it announces when that fits the file and the cap."""
    if obj.size == 0:
        return b""
    prefix = await read_range(client, obj, retry, 0, min(obj.size, LENGTH_BYTES) - 1)
    if len(prefix) < LENGTH_BYTES:
        return prefix
    try:
        length = header_length(prefix)
    except ValueError:
        return prefix                # spec.lora_adapter.check_header refuses it by name
    if LENGTH_BYTES + length > obj.size:
        return prefix
    return prefix + await read_range(client, obj, retry, LENGTH_BYTES, LENGTH_BYTES + length - 1)
