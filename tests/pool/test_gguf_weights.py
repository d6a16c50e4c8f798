"""A `.gguf` model URI in the pool, against real S3 (SeaweedFS): inspected at deploy from
its header with ranged GETs, imported on a cold start into a cache entry keyed by the
object's ETag, and found there by the next cold start."""
import asyncio
import json
import os
import struct
import time

import pytest

from pool.weights import gguf
from pool.api import ColdStartFailed, ModelUnavailable
from pool.weights.inspection import inspect_model
from pool.weights.cache import WeightCache, entry_key
from pool.weights.store import WeightStore
from tests.pool.conftest import FlakyS3
from tests.support.gguf_files import write_model_gguf
from spec import gguf as spec_gguf

pytestmark = pytest.mark.asyncio(loop_scope="session")


def store_for(client, settings):
    return WeightStore(client, WeightCache(settings.cache_dir, settings.cache_budget_bytes), settings)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf"
    write_model_gguf(path, tiny_model, "Q8_0")
    return path


def upload(s3_server, path, bucket, key) -> str:
    s3_server.client().upload_file(str(path), bucket, key)
    return f"s3://{bucket}/{key}"


async def test_inspect_reads_the_header_in_ranges(s3, s3_server, pool_bucket, fresh_prefix, tiny_gguf,
                                                  tiny_model, monkeypatch, tmp_path):
    uri = upload(s3_server, tiny_gguf, pool_bucket, f"{fresh_prefix}/tiny.Q8_0.gguf")
    monkeypatch.setattr(gguf, "FIRST_READ", 256)            # the header is ~10 KB: several reads
    counting = FlakyS3(s3)
    info = await inspect_model(counting, uri)
    config = json.loads((tiny_model / "config.json").read_text())
    assert info.architecture == "LlamaForCausalLM" and info.files == ("tiny.Q8_0.gguf",)
    assert (info.num_hidden_layers, info.num_attention_heads, info.num_key_value_heads, info.head_dim) == \
        (2, 4, 2, 16)
    assert (info.vocab_size, info.max_position_embeddings) == (config["vocab_size"], config["max_position_embeddings"])
    from safetensors.numpy import load_file

    params = sum(t.size for t in load_file(str(tiny_model / "model.safetensors")).values())
    assert (info.num_parameters, info.dtype) == (params, "float32")
    # the Q8_0 matrices stay 8-bit in memory: sized as the imported folder's tensors are
    from runtime.gguf.importer import import_gguf

    imported = load_file(str(import_gguf(tiny_gguf, tmp_path / "imported") / "model.safetensors"))
    assert info.weight_bytes == sum(t.nbytes for t in imported.values()) < 2 * params
    assert info.quantization == {"format": "gguf", "kept": {"Q8_0": 7 * 2 + 1 + 1}, "widened": []}
    assert info.quantized_bytes == sum(t.nbytes for n, t in imported.items() if n.rsplit(".", 1)[-1] in
                                       ("codes", "scales"))
    assert 1 < counting.calls < 10 and counting.calls <= tiny_gguf.stat().st_size // 256


async def test_corrupt_missing_or_unsupported_is_model_unavailable(s3, s3_server, pool_bucket, fresh_prefix,
                                                                   tiny_gguf, tmp_path):
    data = tiny_gguf.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-64])
    (tmp_path / "cfg.gguf").write_bytes(data.replace(b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00"
                                                     b"\x00\x00\x00\x00llama", b"general.architecture\x08\x00"
                                                     b"\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00gpt-j"))
    cases = {"cut.gguf": "tensor output_norm.weight: its data", "cfg.gguf": "general.architecture: 'gpt-j'"}
    for name, message in cases.items():
        uri = upload(s3_server, tmp_path / name, pool_bucket, f"{fresh_prefix}/{name}")
        with pytest.raises(ModelUnavailable, match=f"bad GGUF {uri}: {message}"):
            await inspect_model(s3, uri)
    with pytest.raises(ModelUnavailable, match="missing object"):
        await inspect_model(s3, f"s3://{pool_bucket}/{fresh_prefix}/absent.gguf")


async def test_cold_start_imports_once_then_reuses_the_folder(s3, s3_server, pool_bucket, fresh_prefix, settings,
                                                              tiny_gguf, tiny_model, tmp_path):
    uri = upload(s3_server, tiny_gguf, pool_bucket, f"{fresh_prefix}/m.gguf")
    first = await store_for(s3, settings).fetch_model(uri)
    assert first.downloaded_bytes == tiny_gguf.stat().st_size
    assert sorted(os.listdir(first.model_dir)) == ["config.json", "generation_config.json", "model.safetensors",
                                                   "tokenizer.json", "tokenizer_config.json"]
    counting = FlakyS3(s3)
    again = await store_for(counting, settings).fetch_model(uri)        # a new store over the same cache
    assert again.model_dir == first.model_dir and again.downloaded_bytes == 0 and counting.calls == 0
    (obj,) = await store_for(s3, settings).list_model(uri)
    assert again.keys == (gguf.imported_key(obj),) and entry_key(obj) not in again.keys

    other = tmp_path / "other.gguf"                         # new bytes under the same key: a new ETag
    write_model_gguf(other, tiny_model, "F16")
    upload(s3_server, other, pool_bucket, f"{fresh_prefix}/m.gguf")
    changed = await store_for(s3, settings).fetch_model(uri)
    assert changed.model_dir != first.model_dir and changed.downloaded_bytes == other.stat().st_size


async def test_an_import_that_fails_says_why(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_gguf, tmp_path):
    data = tiny_gguf.read_bytes()
    (tmp_path / "bad.gguf").write_bytes(data.replace(b"tokenizer.ggml.pre\x08\x00\x00\x00\x07\x00\x00\x00\x00\x00"
                                                     b"\x00\x00default", b"tokenizer.ggml.pre\x08\x00\x00\x00\x07"
                                                     b"\x00\x00\x00\x00\x00\x00\x00klingon"))
    uri = upload(s3_server, tmp_path / "bad.gguf", pool_bucket, f"{fresh_prefix}/bad.gguf")
    with pytest.raises(ColdStartFailed, match=f"importing {uri} failed: .*tokenizer.ggml.pre: 'klingon'"):
        await store_for(s3, settings).fetch_model(uri)


def gguf_with_array(count: int, item_type: int, items: bytes) -> bytes:
    """A GGUF header of one metadata array (and no tensors) followed by its items."""
    key = b"tokenizer.ggml.tokens"
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<IIQ", 9, item_type, count) + items)


class RangeLog(FlakyS3):
    """Counts the bytes of every ranged GET."""

    def __init__(self, client):
        super().__init__(client)
        self.bytes_asked = 0

    async def get_object(self, **kwargs):
        start, end = kwargs["Range"].removeprefix("bytes=").split("-")
        self.bytes_asked += int(end) - int(start) + 1
        return await super().get_object(**kwargs)


async def test_a_header_past_the_cap_is_refused_without_reading_it(s3, s3_server, pool_bucket, fresh_prefix,
                                                                   monkeypatch):
    monkeypatch.setattr(spec_gguf, "HEADER_MAX_BYTES", 64 << 10)
    monkeypatch.setattr(gguf, "FIRST_READ", 16 << 10)
    key = f"{fresh_prefix}/big-header.gguf"
    s3_server.client().put_object(Bucket=pool_bucket, Key=key, Body=gguf_with_array(1 << 20, 0, bytes(1 << 20)))
    log = RangeLog(s3)
    with pytest.raises(ModelUnavailable, match=r"array length 1048576 does not fit .* 65536-byte header"):
        await inspect_model(log, f"s3://{pool_bucket}/{key}")
    assert log.bytes_asked <= 16 << 10              # refused from the first read: its count


async def test_a_large_header_is_parsed_off_the_event_loop(s3, s3_server, pool_bucket, fresh_prefix):
    """Two million strings: seconds of parsing, in a thread, while the loop keeps its beat."""
    n = 2_000_000
    items = b"".join(struct.pack("<Q", 7) + b"t%06d" % (i % 10**6) for i in range(n))
    key = f"{fresh_prefix}/many-strings.gguf"
    s3_server.client().put_object(Bucket=pool_bucket, Key=key, Body=gguf_with_array(n, 8, items))
    inspection = asyncio.ensure_future(inspect_model(s3, f"s3://{pool_bucket}/{key}"))
    longest = 0.0
    while not inspection.done():
        before = time.monotonic()
        await asyncio.sleep(0.01)
        longest = max(longest, time.monotonic() - before)
    with pytest.raises(ModelUnavailable, match="general.architecture"):    # parsed whole, then described
        inspection.result()
    assert longest < 0.5


async def test_a_gguf_swapped_after_deploy_is_refused(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_gguf):
    uri = upload(s3_server, tiny_gguf, pool_bucket, f"{fresh_prefix}/tiny.Q8_0.gguf")
    deployed = (await inspect_model(s3, uri)).objects
    assert list(deployed) == [uri]
    s3_server.client().put_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/tiny.Q8_0.gguf",
                                  Body=tiny_gguf.read_bytes() + bytes(4096))
    store = store_for(s3, settings)
    with pytest.raises(ColdStartFailed, match=r"tiny.Q8_0.gguf changed since its revision was deployed"):
        await store.fetch_model(uri, pins=deployed)
    assert store.cache.used_bytes == 0


@pytest.mark.parametrize("restart", [False, True], ids=["same-store", "after-restart"])
async def test_an_imported_folder_overwritten_on_disk_is_imported_again(s3, s3_server, pool_bucket, fresh_prefix,
                                                                        settings, tiny_gguf, restart):
    uri = upload(s3_server, tiny_gguf, pool_bucket, f"{fresh_prefix}/m.gguf")
    store = store_for(s3, settings)
    first = await store.fetch_model(uri)
    weights = (first.model_dir / "model.safetensors")
    imported = weights.read_bytes()
    os.chmod(weights, 0o644)
    weights.write_bytes(os.urandom(len(imported)))           # the same size, other bytes
    store.release(first)
    again = await (store_for(s3, settings) if restart else store).fetch_model(uri)
    assert (again.model_dir / "model.safetensors").read_bytes() == imported
    assert again.downloaded_bytes == 0                        # imported again from the cached object
