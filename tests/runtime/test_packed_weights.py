"""The node's cache of packed layers (runtime/load/packed_weights.py): a second load of the
same model maps the layers its first load packed, and answers the same bits."""
from __future__ import annotations

import os
import time

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.models.decoder import LayerWeights
from runtime.load.packed_weights import MAGIC, PackedWeightCache, available, cache_key
from runtime.load.quantization import Int8Weight

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no AOTInductor shim to rebuild "
                                                        "packed tensors with")

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
PROMPTS = [[5, 6, 7, 8], list(range(20, 61))]


def _load(model, cache_dir, **options) -> LLM:
    return LLM(str(model), kv_cache_tokens=512, packed_cache_dir=str(cache_dir), **options)


def _answers(llm: LLM) -> list[tuple]:
    return [(o.token_ids, o.logprobs) for o in llm.generate(PROMPTS, PARAMS)]


def _wait_written(llm: LLM) -> int:
    writer = llm.engine.runner.model.packed_writer
    assert writer is not None, "a first load writes the cache"
    return writer.result(timeout=120)


def _inside(t: torch.Tensor, mapping) -> bool:
    import ctypes
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    ptr = torch.ops.mkldnn.data_ptr(t) if t.is_mkldnn else t.data_ptr()
    return base <= ptr < base + len(mapping)


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_second_load_maps_what_the_first_packed(tiny_model, tmp_path, quantization):
    plain = LLM(str(tiny_model), kv_cache_tokens=512, quantization=quantization)
    expected = _answers(plain)
    first = _load(tiny_model, tmp_path, quantization=quantization)
    assert first.engine.runner.model.packed_mapping is None, "nothing cached yet: packed afresh"
    written = _wait_written(first)
    assert written > 0 and len(list(tmp_path.glob("*.pack"))) == 1
    assert _answers(first) == expected

    second = _load(tiny_model, tmp_path, quantization=quantization)
    model = second.engine.runner.model
    assert model.packed_mapping is not None and model.packed_writer is None
    layer = model.layers[0]
    matmul = layer.qkv.qweight if quantization else layer.qkv
    assert matmul.is_mkldnn == (quantization is None)
    assert _inside(matmul, model.packed_mapping), "the weights are read where the file is mapped"
    assert isinstance(layer.qkv, Int8Weight) == (quantization == "int8")
    assert _answers(second) == expected, "the same bits as a load that packed"


def test_the_key_follows_the_weights_and_what_packs_them(tiny_model, tmp_path):
    identity = {"model": "LlamaModel", "dtype": "torch.float32", "quantization": None}
    key = cache_key(tiny_model, identity)
    assert key == cache_key(tiny_model, dict(identity))
    assert key != cache_key(tiny_model, {**identity, "quantization": "int8"})
    weights = next(tiny_model.glob("*.safetensors"))
    stat = weights.stat()
    try:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))   # a new copy of the file
        assert cache_key(tiny_model, identity) != key
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_file_it_did_not_write_is_packed_afresh_and_replaced(tiny_model, tmp_path):
    first = _load(tiny_model, tmp_path)
    _wait_written(first)
    (path,) = tmp_path.glob("*.pack")
    path.write_bytes(b"not a pack file at all")
    again = _load(tiny_model, tmp_path)
    assert again.engine.runner.model.packed_mapping is None
    _wait_written(again)
    assert path.read_bytes().startswith(MAGIC)
    assert _load(tiny_model, tmp_path).engine.runner.model.packed_mapping is not None


def test_least_recently_used_files_go_past_the_budget(tmp_path):
    layer = LayerWeights(attn_norm=torch.ones(8), qkv=torch.randn(24, 8), o=torch.randn(8, 8),
                         mlp_norm=torch.ones(8), gate_up=torch.randn(32, 8), down=torch.randn(8, 16))
    cache = PackedWeightCache(tmp_path, budget_bytes=1 << 40)
    size = cache.store("a", [layer])
    cache.store("b", [layer])
    now = time.time()
    os.utime(cache.path("a"), (now - 100, now - 100))        # a: the least recently used
    os.utime(cache.path("b"), (now - 50, now - 50))
    (tmp_path / f"c.{2 ** 22 + 7}.partial").write_bytes(b"x")   # a writer that died (no such pid)
    small = PackedWeightCache(tmp_path, budget_bytes=2 * size)
    small.store("c", [layer])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.pack", "c.pack"]
    mapped = small.load("b", LayerWeights)
    assert mapped is not None
    (back,) = mapped.layers
    for name in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down"):
        assert torch.equal(getattr(back, name), getattr(layer, name)), name
    assert back.qkv_bias is None


def test_smoothed_w8a8_layers_are_cached_and_calibrated_once(tiny_model, tmp_path, monkeypatch):
    """Under W8A8 the int8 layers are smoothed at load after a calibration forward
    (runtime/load/smoothing.py); the cache keeps the smoothed layers apart from plain int8's,
    and a load that maps them skips the calibration."""
    from kernels.cpu import w8a8_linear
    from kernels.cpu.features import CpuFeatures
    from runtime.models import decoder

    if not w8a8_linear.available():
        pytest.skip("this torch has no torch._int_mm")
    _wait_written(_load(tiny_model, tmp_path, quantization="int8"))          # plain int8's entry
    monkeypatch.setattr(decoder, "detect_cpu", lambda: CpuFeatures(avx512_vnni=True))
    first = _load(tiny_model, tmp_path, quantization="int8", cpu_low_precision=True)
    assert first.engine.runner.model.packed_mapping is None, "plain int8's entry is not reused"
    assert "calibrate" in first.engine.load_timings
    _wait_written(first)
    expected = _answers(first)
    second = _load(tiny_model, tmp_path, quantization="int8", cpu_low_precision=True)
    assert second.engine.runner.model.packed_mapping is not None
    assert "calibrate" not in second.engine.load_timings
    assert _answers(second) == expected
    assert len(list(tmp_path.glob("*.pack"))) == 2


def test_a_quantized_checkpoints_layers_map_back_as_they_were(tiny_model, tmp_path):
    """GGUF Q4_0 kept 4-bit: the fused layers' group-wise weights round-trip through the file."""
    from kernels.group_quant import GroupQuantized
    from runtime.gguf.importer import import_gguf
    from tests.support.gguf_files import write_model_gguf

    write_model_gguf(tmp_path / "m.gguf", tiny_model, "Q4_0")
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "folder")
    expected = _answers(LLM(str(folder), kv_cache_tokens=512))
    first = _load(folder, tmp_path / "cache")
    assert _wait_written(first) > 0 and _answers(first) == expected
    second = _load(folder, tmp_path / "cache")
    model = second.engine.runner.model
    qkv = model.layers[0].qkv
    assert model.packed_mapping is not None and isinstance(qkv, GroupQuantized)
    assert _inside(qkv.codes, model.packed_mapping)
    for name in ("codes", "scales", "offsets"):
        assert torch.equal(getattr(qkv, name), getattr(first.engine.runner.model.layers[0].qkv, name)), name
    assert _answers(second) == expected
