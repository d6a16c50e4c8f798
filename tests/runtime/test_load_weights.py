"""The loader: safetensors headers read by hand, tensors viewed in place in the mapped file
(no copy), shards as views, and the bytes it moved in the load timings."""
from __future__ import annotations

import ctypes
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from runtime.load.timings import LoadTimings
from runtime.load.weights import map_file, mapped_weights, read_weights, tensor_view
from runtime.load.safetensors_layout import chunks, header_length, parse_header
from runtime.tensor_parallel.shards import Shard

TENSORS = {"a.weight": torch.arange(12, dtype=torch.float32).view(3, 4),
           "b.bias": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
           "c.ids": torch.tensor([7, 8, 9], dtype=torch.int64),
           "d.empty": torch.zeros(0, 5)}


@pytest.fixture
def model_dir(tmp_path):
    save_file(TENSORS, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    return tmp_path


def _header(spec: dict) -> bytes:
    return json.dumps(spec).encode()


def test_the_header_gives_every_tensor_in_file_order():
    header = _header({"__metadata__": {"format": "pt"},
                      "y": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]},
                      "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    entries = parse_header(header, file_size=8 + len(header) + 12)
    assert [(e.name, e.dtype, e.shape, e.offset - 8 - len(header), e.nbytes) for e in entries] == \
        [("x", "float32", (2,), 0, 8), ("y", "float16", (2,), 8, 4)]


@pytest.mark.parametrize("spec, message", [
    ({"t": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, "unknown dtype"),
    ({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, "needs 16"),
    ({"t": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}, "past the end"),
])
def test_a_broken_header_is_refused_naming_the_tensor(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_header(_header(spec), file_size=100)


def test_header_length_and_chunks():
    assert header_length(struct.pack("<Q", 96)) == 96
    with pytest.raises(ValueError, match="cap"):
        header_length(struct.pack("<Q", 1 << 40))
    assert chunks(0, 10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert chunks(3, 3, 4) == []


def test_mapped_tensors_equal_what_safetensors_reads(model_dir):
    tensors, moved = mapped_weights(model_dir, torch.float32)
    assert moved == (model_dir / "model.safetensors").stat().st_size
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            assert torch.equal(tensors[name], f.get_tensor(name).to(tensors[name].dtype)), name
            assert tensors[name].dtype == (torch.float32 if name != "c.ids" else torch.int64), name
    # integers (a quantized weight's codes) keep their dtype; floats take the engine's


def test_tensors_are_views_of_the_mapping_not_copies(model_dir):
    mapping, entries = map_file(model_dir / "model.safetensors")
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    for entry in entries:
        if entry.nbytes:
            assert tensor_view(mapping, entry).data_ptr() == base + entry.offset, entry.name


def test_a_misaligned_tensor_is_copied_and_still_right(tmp_path):
    """A header whose length leaves the data at an odd offset (another writer's padding)."""
    data = torch.tensor([3.25, -1.0], dtype=torch.float32).numpy().tobytes()
    header = _header({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}) + b" "
    if (8 + len(header)) % 4 == 0:
        header += b" "
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    mapping, (entry,) = map_file(path)
    assert not entry.aligned
    assert tensor_view(mapping, entry).tolist() == [3.25, -1.0]


def test_shards_are_the_rows_or_columns_asked_for(model_dir):
    shards = {"a.weight": Shard(dim=1, start=1, stop=3), "b.bias": Shard(dim=0, start=1, stop=2)}
    tensors, _ = mapped_weights(model_dir, torch.float32, shards.get)
    assert torch.equal(tensors["a.weight"], TENSORS["a.weight"][:, 1:3])
    assert tensors["a.weight"].is_contiguous()
    assert tensors["b.bias"].tolist() == [-2.0]


def test_read_weights_records_the_stage_and_its_bytes(model_dir):
    timings = LoadTimings()
    tensors = read_weights(model_dir, torch.float32, "cpu", timings)
    assert set(tensors) == set(TENSORS)
    assert list(timings.stages) == ["weights"]
    assert timings.weight_bytes == (model_dir / "model.safetensors").stat().st_size
    assert timings.weights_gbps() is not None       # a tiny file: the figure itself says little
