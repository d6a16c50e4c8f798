"""inspect_model reads config and safetensors headers from real S3 (SeaweedFS)."""
import json

import pytest
from safetensors import safe_open

from pool.weights import inspection as model_info
from pool.api import ModelUnavailable, PinnedObject
from pool.weights.inspection import inspect_model, summarize
from pool.s3 import list_objects
from tests.pool.conftest import FlakyS3
from tests.support.model_factory import upload_model

pytestmark = pytest.mark.asyncio(loop_scope="session")


def local_totals(folder):
    params = nbytes = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                params += t.numel()
                nbytes += t.numel() * t.element_size()
    return params, nbytes


async def test_inspect_single_file_model(s3, s3_server, pool_bucket, fresh_prefix, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    info = await inspect_model(s3, uri)
    params, nbytes = local_totals(tiny_model)
    assert info.architecture == "LlamaForCausalLM"
    assert (info.num_parameters, info.weight_bytes, info.dtype) == (params, nbytes, "float32")
    assert info.files == ("model.safetensors",)
    assert info.num_hidden_layers == 2 and info.num_key_value_heads == 2 and info.head_dim == 16
    assert (info.num_attention_heads, info.vocab_size) == (4, 512)     # GQA 4:2, not the KV heads
    assert 0 < info.linear_parameters < info.num_parameters


async def test_inspect_sharded_bf16_model(s3, s3_server, pool_bucket, fresh_prefix, model_factory):
    folder = model_factory(arch="qwen2", dtype="bfloat16", max_shard_size="100KB")
    uri = upload_model(folder, s3_server.client(), pool_bucket, f"{fresh_prefix}/sharded")
    info = await inspect_model(s3, uri)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(info.files) > 1 and set(info.files) == set(index["weight_map"].values())
    assert info.architecture == "Qwen2ForCausalLM" and info.dtype == "bfloat16"
    config = json.loads((folder / "config.json").read_text())
    assert (info.num_attention_heads, info.vocab_size) == (config["num_attention_heads"], config["vocab_size"])
    assert (info.num_parameters, info.weight_bytes) == local_totals(folder)


async def test_missing_config_or_weights_is_a_clear_error(s3, s3_server, pool_bucket, fresh_prefix, tiny_model):
    with pytest.raises(ModelUnavailable, match="config.json"):
        await inspect_model(s3, f"s3://{pool_bucket}/{fresh_prefix}/nothing/")
    client = s3_server.client()
    client.upload_file(str(tiny_model / "config.json"), pool_bucket, f"{fresh_prefix}/half/config.json")
    with pytest.raises(ModelUnavailable, match="model.safetensors"):
        await inspect_model(s3, f"s3://{pool_bucket}/{fresh_prefix}/half/")


async def test_head_and_vocab_counts_come_from_config_and_are_zero_when_absent():
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 96, "num_attention_heads": 6,
              "num_key_value_heads": 2, "vocab_size": 1000}
    info = summarize("s3://b/m/", config, ["model.safetensors"], [])
    assert (info.num_attention_heads, info.num_key_value_heads, info.head_dim, info.vocab_size) == (6, 2, 16, 1000)
    bare = summarize("s3://b/m/", {"architectures": ["LlamaForCausalLM"]}, ["model.safetensors"], [])
    assert (bare.num_attention_heads, bare.vocab_size) == (0, 0)          # unknown, not a guess


CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 1}).encode()


def shard(header_bytes: int = 0, entry: dict | None = None) -> bytes:
    """A one-tensor safetensors file whose JSON header is padded with spaces to header_bytes."""
    entry = entry if entry is not None else {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    header = json.dumps({"w": entry}).encode()
    header += b" " * max(0, header_bytes - len(header))
    return len(header).to_bytes(8, "little") + header + bytes(4)


def put(s3_server, bucket, prefix, files: dict[str, bytes]) -> str:
    client = s3_server.client()
    for name, body in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)
    return f"s3://{bucket}/{prefix}/"


async def test_an_index_naming_too_many_shards_is_refused_before_any_is_read(s3, s3_server, pool_bucket,
                                                                            fresh_prefix):
    names = {f"t{i}": f"{i}.safetensors" for i in range(model_info.MAX_SHARDS + 1)}
    index = json.dumps({"weight_map": names}).encode()
    uri = put(s3_server, pool_bucket, fresh_prefix, {"config.json": CONFIG,
                                                     "model.safetensors.index.json": index})
    counting = FlakyS3(s3)
    with pytest.raises(ModelUnavailable, match=f"{model_info.MAX_SHARDS + 1} weight files, over the cap"):
        await inspect_model(counting, uri)
    assert counting.calls == 2                          # config.json and the index, no shard


async def test_too_many_safetensors_files_are_refused(s3, s3_server, pool_bucket, fresh_prefix, monkeypatch):
    monkeypatch.setattr(model_info, "MAX_SHARDS", 3)
    files = {f"model-{i}.safetensors": shard() for i in range(4)}
    uri = put(s3_server, pool_bucket, fresh_prefix, {"config.json": CONFIG, **files})
    counting = FlakyS3(s3)
    with pytest.raises(ModelUnavailable, match="4 weight files, over the cap of 3"):
        await inspect_model(counting, uri)
    assert counting.calls == 1                          # config.json only


async def test_headers_past_their_total_cap_are_refused_before_they_are_read(s3, s3_server, pool_bucket,
                                                                            fresh_prefix, monkeypatch):
    monkeypatch.setattr(model_info, "HEADERS_MAX_BYTES", 300_000)
    files = {"model-1.safetensors": shard(200_000), "model-2.safetensors": shard(200_000)}
    uri = put(s3_server, pool_bucket, fresh_prefix, {"config.json": CONFIG, **files})
    counting = FlakyS3(s3)
    with pytest.raises(ModelUnavailable, match=r"model-2.safetensors: 200000 bytes, past what is left "
                                               r"\(100000\) of the 300000-byte cap"):
        await inspect_model(counting, uri)
    # config.json; the first header in two reads (it is past the first 64 KiB); the second's
    # first 64 KiB, where its length is, and nothing of it after that
    assert counting.calls == 4


async def test_a_header_entry_without_a_shape_is_model_unavailable(s3, s3_server, pool_bucket, fresh_prefix):
    files = {"model.safetensors": shard(entry={"dtype": "F32", "data_offsets": [0, 4]})}
    uri = put(s3_server, pool_bucket, fresh_prefix, {"config.json": CONFIG, **files})
    with pytest.raises(ModelUnavailable, match="without a valid dtype, shape or data_offsets"):
        await inspect_model(s3, uri)


async def test_inspection_names_every_object_it_read_with_its_etag_and_size(s3, s3_server, pool_bucket, fresh_prefix,
                                                                            tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    listed = await list_objects(s3, pool_bucket, f"{fresh_prefix}/tiny/")
    info = await inspect_model(s3, uri)
    assert info.objects == {f"s3://{pool_bucket}/{o.key}": PinnedObject(o.etag, o.size) for o in listed}
    assert len(info.objects) == sum(1 for f in tiny_model.iterdir() if f.is_file())


async def test_an_object_changed_after_it_was_listed_is_not_read(s3, s3_server, pool_bucket, fresh_prefix):
    put(s3_server, pool_bucket, fresh_prefix, {"config.json": CONFIG})
    (listed,) = await list_objects(s3, pool_bucket, f"{fresh_prefix}/")
    put(s3_server, pool_bucket, fresh_prefix, {"config.json": b'{"architectures": ["Other"]}'})
    with pytest.raises(ModelUnavailable, match=r"config.json changed while it was read \(ETag no longer"):
        await model_info.read_json(s3, listed, lambda call: call())


async def test_a_quantization_config_the_runtime_cannot_serve_is_refused_naming_the_field(s3, s3_server, pool_bucket,
                                                                                        fresh_prefix):
    config = json.dumps({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 1,
                         "quantization_config": {"quant_method": "awq", "bits": 3, "group_size": 128}}).encode()
    uri = put(s3_server, pool_bucket, fresh_prefix, {"config.json": config, "model.safetensors": shard()})
    counting = FlakyS3(s3)
    with pytest.raises(ModelUnavailable, match=r"config.json: quantization_config.bits: 3 is not supported \(4\)"):
        await inspect_model(counting, uri)
    assert counting.calls == 1                          # refused from config.json alone


@pytest.mark.parametrize("fmt", ["awq", "gptq-desc-act", "w4a16", "w8a8", "fp8"])
async def test_a_quantized_folder_is_sized_at_its_loaded_bytes(fmt, s3, s3_server, pool_bucket, fresh_prefix,
                                                               tiny_model, tmp_path):
    import torch

    from pool.placement import weight_bytes
    from runtime.load.hf_quantized import gather, keep_dtype
    from runtime.load.timings import LoadTimings
    from runtime.load.weights import read_weights
    from spec.quantization_config import scheme
    from tests.runtime.test_hf_quantized import FOLDERS
    from tests.support.quant_packers import quantized_folder

    config, pack, _ = FOLDERS[fmt]
    folder = quantized_folder(tiny_model, tmp_path / fmt, config, pack)
    info = await inspect_model(s3, upload_model(folder, s3_server.client(), pool_bucket, f"{fresh_prefix}/{fmt}"))
    s = scheme(json.loads((folder / "config.json").read_text()))
    loaded = gather(read_weights(folder, torch.float32, "cpu", LoadTimings(), keep=keep_dtype(s)), s, torch.float32)
    actual = sum(w.nbytes for w in loaded.values())
    quantized = sum(w.nbytes for w in loaded.values() if not isinstance(w, torch.Tensor))
    assert info.linear_parameters == 0
    assert quantized <= info.quantized_bytes <= 1.25 * quantized
    assert actual <= weight_bytes(info, "float32", None)
    floats = weight_bytes(info, "float32", None) - info.quantized_bytes
    assert weight_bytes(info, "bfloat16", None) == floats // 2 + info.quantized_bytes
