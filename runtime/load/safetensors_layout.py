"""Where each tensor of a safetensors file lies, read from its header; pure, no I/O.

The format: 8 bytes (little-endian u64) giving the header's length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then
the data, offsets counted from its start at 8 + N.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

PREFIX_BYTES = 8
MAX_HEADER_BYTES = 100 << 20          # the reference implementation's own cap

# safetensors dtype -> (torch dtype name, bytes per element)
DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
          "BF16": ("bfloat16", 2), "I64": ("int64", 8), "I32": ("int32", 4),
          "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1), "BOOL": ("bool", 1),
          "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1)}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str                 # torch's name for it: "float32", "bfloat16", ...
    shape: tuple[int, ...]
    offset: int                # from the start of the file
    nbytes: int
    itemsize: int

    @property
    def aligned(self) -> bool:
        """Whether the tensor can be viewed in place (its start is a multiple of its element size)."""
        return self.offset % self.itemsize == 0


def header_length(prefix: bytes) -> int:
    """The first PREFIX_BYTES of a file -> the length of its JSON header."""
    if len(prefix) < PREFIX_BYTES:
        raise ValueError("safetensors: file shorter than its header prefix")
    n: int = struct.unpack("<Q", prefix[:PREFIX_BYTES])[0]
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"safetensors: header of {n} bytes is past the {MAX_HEADER_BYTES}-byte cap")
    return n


def parse_header(header: bytes, file_size: int) -> list[TensorEntry]:
    """The JSON header (without its prefix) -> every tensor, in file order; ValueError
    naming the tensor for an unknown dtype, a size that does not match its shape, or
    bytes past the end of the file."""
    data_start = PREFIX_BYTES + len(header)
    entries = [_entry(name, spec, data_start) for name, spec in json.loads(header).items()
               if name != "__metadata__"]
    for e in entries:
        if e.offset + e.nbytes > file_size:
            raise ValueError(f"safetensors: {e.name} ends past the end of the file")
    return sorted(entries, key=lambda e: e.offset)


def _entry(name: str, spec: dict[str, Any], data_start: int) -> TensorEntry:
    if spec.get("dtype") not in DTYPES:
        raise ValueError(f"safetensors: {name} has unknown dtype {spec.get('dtype')!r}")
    dtype, itemsize = DTYPES[spec["dtype"]]
    shape = tuple(int(d) for d in spec["shape"])
    begin, end = (int(x) for x in spec["data_offsets"])
    numel = 1
    for d in shape:
        numel *= d
    if end - begin != numel * itemsize or begin < 0:
        raise ValueError(f"safetensors: {name} holds {end - begin} bytes, its shape {list(shape)} needs "
                         f"{numel * itemsize}")
    return TensorEntry(name, dtype, shape, data_start + begin, end - begin, itemsize)


def chunks(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) cut into (offset, length) pieces of at most `size` bytes."""
    return [(o, min(size, stop - o)) for o in range(start, stop, size)]
