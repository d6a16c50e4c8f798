"""inspect_adapter reads an adapter's two files from real S3 (SeaweedFS), no further than
its checks need, and judges nothing: spec.lora_adapter refuses what it read by name."""
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save

from pool.api import ModelUnavailable, PinnedObject
from pool.weights.adapter_inspection import inspect_adapter
from spec import lora_adapter

pytestmark = pytest.mark.asyncio(loop_scope="session")
CONFIG = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
DIMS = lora_adapter.BaseDims(num_hidden_layers=1, hidden_size=8, intermediate_size=16,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=4)
KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"


def weights() -> bytes:
    return save({KEY.format("A"): np.zeros((2, 8), np.float32),
                 KEY.format("B"): np.zeros((8, 2), np.float32)})


def put(s3_server, bucket: str, prefix: str, files: dict[str, bytes]) -> str:
    client = s3_server.client()
    for name, body in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)
    return f"s3://{bucket}/{prefix}/"


async def test_reads_the_config_and_the_header_and_pins_both(s3, s3_server, pool_bucket, fresh_prefix):
    body = weights()
    uri = put(s3_server, pool_bucket, fresh_prefix, {"adapter_config.json": json.dumps(CONFIG).encode(),
                                                     "adapter_model.safetensors": body,
                                                     "README.md": b"not read"})
    info = await inspect_adapter(s3, uri)
    (length,) = struct.unpack("<Q", body[:8])
    assert json.loads(info.config) == CONFIG
    assert info.header == body[:8 + length], "the length and the header, not the tensors"
    assert info.weight_bytes == len(body)
    assert set(info.objects) == {f"{uri}adapter_config.json", f"{uri}adapter_model.safetensors"}
    assert info.objects[f"{uri}adapter_model.safetensors"].size == len(body)
    assert isinstance(info.objects[f"{uri}adapter_config.json"], PinnedObject)
    settings = lora_adapter.parse_settings(info.config, 16)
    assert lora_adapter.check_header(info.header, settings, DIMS) == [(0, "q_proj")]


@pytest.mark.parametrize("present, missing", [({}, "adapter_config.json"),
                                              ({"adapter_config.json": b"{}"}, "adapter_model.safetensors")])
async def test_a_missing_file_is_named(s3, s3_server, pool_bucket, fresh_prefix, present, missing):
    uri = put(s3_server, pool_bucket, fresh_prefix, present) if present else \
        f"s3://{pool_bucket}/{fresh_prefix}/"
    with pytest.raises(ModelUnavailable, match=f"^{missing}: missing"):
        await inspect_adapter(s3, uri)


async def test_reads_stop_where_the_rules_refuse(s3, s3_server, pool_bucket, fresh_prefix):
    """A config past its cap is read one byte past it; a header length past the file is
    read as the 8 bytes alone: the rules then refuse each by name."""
    big = b" " * (lora_adapter.MAX_CONFIG_BYTES + 100)
    lying = struct.pack("<Q", 10_000) + b"{}"
    uri = put(s3_server, pool_bucket, fresh_prefix, {"adapter_config.json": big,
                                                     "adapter_model.safetensors": lying})
    info = await inspect_adapter(s3, uri)
    assert len(info.config) == lora_adapter.MAX_CONFIG_BYTES + 1 and info.header == lying[:8]
    with pytest.raises(ValueError, match="^adapter_config.json: larger than"):
        lora_adapter.parse_settings(info.config, 16)
    settings = lora_adapter.parse_settings(json.dumps(CONFIG), 16)
    with pytest.raises(ValueError, match="^adapter_model.safetensors: cut off inside its header"):
        lora_adapter.check_header(info.header, settings, DIMS)


async def test_empty_files_are_read_as_nothing(s3, s3_server, pool_bucket, fresh_prefix):
    uri = put(s3_server, pool_bucket, fresh_prefix, {"adapter_config.json": b"",
                                                     "adapter_model.safetensors": b""})
    info = await inspect_adapter(s3, uri)
    assert (info.config, info.header, info.weight_bytes) == (b"", b"", 0)
