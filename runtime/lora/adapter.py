"""A PEFT LoRA adapter in host memory, as the engine's slots take it: read from its
adapter_config.json and adapter_model.safetensors (a folder's, or the bytes a replica
was sent), each A [r, in] and each B [out, r] in float32, B pre-scaled by the adapter's
scaling, so a slot's delta is B @ A @ x.

What an adapter may be is spec/lora_adapter.py's to say, the rules the control plane
checks at attach time: its settings (parse_settings), then every tensor's name and shape
against the base (check_header), all before a tensor is read. This module adds only the
torch part.

An adapter's A and B are views of one float32 buffer, and it pickles as that buffer and
where each piece sits in it: across the engine-core pipe, whose pickler (torch's) moves a
tensor's storage into shared memory, an adapter travels as one segment and one file
descriptor rather than one per tensor (the server reads it into a buffer already there:
runtime/lora/shared_buffers.py).

The file's tensors are read as views of its bytes or its mapping (after the spec's check
of its header) and copied once, converted and scaled, into that buffer:
safetensors.torch.load would copy each tensor out of the bytes first, a second pass over
the whole file on a load's path (benchmarks/adapter_load.py times the load).
"""
from __future__ import annotations

import json
import math
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

from runtime.core.config import ModelConfig
from runtime.lora.files import adapter_files
from runtime.lora.shared_buffers import SharedBuffers
from spec.lora_adapter import (WEIGHTS_FILE, AdapterSettings, BaseDims, check_header, header_length,
                               key_parts, parse_settings)

Pair = tuple[torch.Tensor, torch.Tensor]      # A [r, in], B [out, r] * scaling
# a file's bytes, or the file mapped (runtime/serve/adapter_inbox.py); a writable one
# spares torch.frombuffer's warning
Buffer = Union[bytes, bytearray, mmap.mmap]
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}   # spec's DTYPES


@dataclass(frozen=True)
class Piece:
    """Where one projection's A and B sit in an adapter's buffer: A's r * in_features
    elements from `offset`, then B's out_features * r."""
    layer: int
    module: str
    offset: int
    in_features: int
    out_features: int


class LoraAdapter:
    def __init__(self, name: str, rank: int, scaling: float, flat: torch.Tensor,
                 pieces: tuple[Piece, ...]):
        self.name, self.rank, self.scaling = name, rank, scaling
        self.flat, self.pieces = flat, pieces            # flat: [elements] float32
        # (layer, module) -> (A, B): views of `flat`
        self.weights: dict[tuple[int, str], Pair] = {(p.layer, p.module): self._views(p) for p in pieces}

    def _views(self, piece: Piece) -> Pair:
        a_size = self.rank * piece.in_features
        a = self.flat[piece.offset:piece.offset + a_size].view(self.rank, piece.in_features)
        b_at = piece.offset + a_size
        b = self.flat[b_at:b_at + piece.out_features * self.rank].view(piece.out_features, self.rank)
        return a, b

    def __reduce__(self) -> tuple[Any, ...]:
        # the buffer and the pieces, not the views: one storage for the pickler to share
        return LoraAdapter, (self.name, self.rank, self.scaling, self.flat, self.pieces)


def base_dims(config: ModelConfig) -> BaseDims:
    """The base's sizes an adapter's tensors must match."""
    return BaseDims(config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                    config.num_attention_heads, config.num_key_value_heads, config.head_dim)


def adapter_from_bytes(name: str, config_json: Union[bytes, str], safetensors: Buffer, model_config: ModelConfig,
                       max_rank: int, shared: Optional[SharedBuffers] = None) -> LoraAdapter:
    """An adapter from its two files' contents; ValueError naming the field for anything
    the engine cannot apply (spec/lora_adapter.py). `shared`: where to take its buffer
    from, for an adapter bound for another process; else in this process's memory."""
    settings = parse_settings(config_json, max_rank)
    dims = base_dims(model_config)
    check_header(safetensors, settings, dims)    # every name and shape, before any tensor is read
    return _packed(name, settings, dims, _tensors(safetensors), shared)


def read_adapter(name: str, folder: Union[str, Path], config: ModelConfig, max_rank: int) -> LoraAdapter:
    """The adapter in a PEFT folder (adapter_config.json, adapter_model.safetensors)."""
    return adapter_from_bytes(name, *adapter_files(folder), config, max_rank)


def _tensors(data: Buffer) -> dict[str, torch.Tensor]:
    """Each tensor of a safetensors file as a view of its bytes, not a copy (`_packed`
    copies each once, into the adapter's buffer); ValueError where a tensor's bytes are not
    where its header says. Its names, dtypes and shapes are checked already (check_header)."""
    length = header_length(data)
    entries = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    tensors = {}
    for key, entry in entries.items():
        if key != "__metadata__":
            dtype, shape = _DTYPES[entry["dtype"]], entry["shape"]
            count = math.prod(shape)
            begin = _data_start(key, entry.get("data_offsets"), count * dtype.itemsize, len(body))
            tensors[key] = torch.frombuffer(body, dtype=dtype, count=count, offset=begin).view(shape)
    return tensors


def _data_start(key: str, offsets: Any, size: int, available: int) -> int:
    """Where a tensor's `size` bytes begin, if its data_offsets say so within the file."""
    if isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets) and \
            0 <= offsets[0] and offsets[1] - offsets[0] == size and offsets[1] <= available:
        return int(offsets[0])
    raise ValueError(f"{WEIGHTS_FILE}: {key[:120]}'s data_offsets are not its {size} bytes within "
                     f"the file's {available} (cut off?)")


def _packed(name: str, settings: AdapterSettings, dims: BaseDims, tensors: dict[str, torch.Tensor],
            shared: Optional[SharedBuffers]) -> LoraAdapter:
    """The checked tensors in one float32 buffer, in (layer, module) order, B scaled."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        layer, module, half = key_parts(key, dims)
        halves.setdefault((layer, module), {})[half] = tensor
    shapes, rank, offset, pieces = dims.module_shapes(), settings.rank, 0, []
    for layer, module in sorted(halves):
        out_features, in_features = shapes[module]
        pieces.append(Piece(layer, module, offset, in_features, out_features))
        offset += rank * (in_features + out_features)
    flat = shared.take(offset) if shared is not None else torch.empty(offset)
    adapter = LoraAdapter(name, rank, settings.scaling, flat, tuple(pieces))
    for key, (a, b) in adapter.weights.items():
        a.copy_(halves[key]["A"])
        b.copy_(halves[key]["B"]).mul_(settings.scaling)
    return adapter
