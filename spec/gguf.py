"""GGUF, llama.cpp's one-file model format: its header, and what it says as a config.json.

Both sides read it: the pool reads the header of a `.gguf` object in S3 with ranged GETs
at deploy (pool/weights/inspection.py), the runtime imports the whole file into a model folder
(runtime/gguf/importer.py). Pure Python, so the pool reads it without numpy or torch.

Layout, little-endian: b"GGUF", version u32 (2 or 3), tensor count u64, metadata count
u64; metadata entries (key string, value type u32, value); tensor infos (name string,
n_dims u32, dims u64 fastest first, ggml type u32, offset u64 into the data section);
the data section at the next multiple of `general.alignment` (32 by default). A string
is a u64 length and UTF-8 bytes; an array is an element type u32, a count u64, elements.

Every refusal is a `GGUFError` whose message starts with the field or tensor it is about.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, Optional, Union

Buffer = Union[bytes, mmap.mmap]
MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_COUNT = 1 << 24                  # more tensors or metadata entries than any model has
# The header (metadata and tensor infos) is read whole into memory, at deploy by the pool:
# a file whose header goes past this is refused, whatever its size, before the bytes are
# read or a value allocated. A vocabulary of 256k tokens with its merges takes ~20 MiB.
HEADER_MAX_BYTES = 64 << 20
# The fewest bytes one tensor info (name length, one dim, type, offset) and one metadata
# entry (key length, type, a one-byte value) take: counts that cannot fit are refused.
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
_MIN_ENTRY_BYTES = 8 + 4 + 1

# ggml type id -> (name, elements per block, bytes per block): ggml's own table.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# metadata value type id -> struct format of one scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A file this reader refuses; the message names the field or tensor."""


class Truncated(GGUFError):
    """The bytes given end inside the header: read the first `needed` bytes (or more)."""

    def __init__(self, needed: int, where: str):
        super().__init__(f"{where}: the header goes on past byte {needed}")
        self.needed = needed
        self.where = where


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]           # row-major, as numpy and torch see it: GGUF's dims reversed
    ggml_type: int
    offset: int                      # from the start of the data section

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def num_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        _, block, size = GGML_TYPES[self.ggml_type]
        return self.num_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int                 # where the data section starts in the file

    def tensor(self, name: str) -> Optional[TensorInfo]:
        return next((t for t in self.tensors if t.name == name), None)


class _Reader:
    """Reads values off `buf` at `pos`; past its end: Truncated (or GGUFError at the file's end)."""

    def __init__(self, buf: Buffer, file_size: Optional[int]):
        self.buf = buf
        self.pos = 0
        self.file_size = file_size
        self.where = "header"
        self.limit = HEADER_MAX_BYTES if file_size is None else min(file_size, HEADER_MAX_BYTES)

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            if self.file_size is not None and end > self.file_size:
                raise GGUFError(f"{self.where}: runs past the end of the file ({self.file_size} bytes)")
            if end > HEADER_MAX_BYTES:
                raise GGUFError(f"{self.where}: the header runs past {HEADER_MAX_BYTES} bytes, "
                                "the most this reader takes")
            raise Truncated(end, self.where)
        out = bytes(self.buf[self.pos:end])
        self.pos = end
        return out

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))[0]

    def count(self, what: str, item_bytes: int = 1) -> int:
        n: int = self.scalar("Q")
        self.check_room(what, n, item_bytes)
        return n

    def check_room(self, what: str, n: int, item_bytes: int) -> None:
        """Refuses n items of at least item_bytes each that cannot fit in what is left
        of the file or of the header cap, before any of them is read."""
        if n > (self.limit - self.pos) // max(item_bytes, 1):
            raise GGUFError(f"{self.where}: {what} {n} does not fit in the file or in the "
                            f"{HEADER_MAX_BYTES}-byte header this reader takes")

    def string(self) -> str:
        raw = self.take(self.count("string length"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{self.where}: a string that is not UTF-8 ({exc.reason})") from None

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item: int = self.scalar("I")
            if item == _ARRAY:
                raise GGUFError(f"{self.where}: arrays of arrays are not supported")
            if item in _SCALARS:
                fmt = _SCALARS[item]
                n = self.count("array length", struct.calcsize(fmt))
                return list(struct.unpack(f"<{n}{fmt}", self.take(n * struct.calcsize(fmt))))
            if item == _STRING:
                return [self.string() for _ in range(self.count("array length", 8))]
            raise GGUFError(f"{self.where}: unknown array element type {item}")
        raise GGUFError(f"{self.where}: unknown value type {kind}")


def parse_header(buf: Buffer, file_size: Optional[int] = None) -> GGUFHeader:
    """The header at the start of `buf` (bytes, or a whole file memory-mapped). `file_size`
    (when known) tells a corrupt length from a buffer that is merely short (`Truncated`:
    read more and call again)."""
    r = _Reader(buf, file_size)
    if r.take(4) != MAGIC:
        raise GGUFError("magic: not a GGUF file (it does not start with b'GGUF')")
    r.where = "version"
    version: int = r.scalar("I")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        raise GGUFError(f"version: {swapped} (big-endian GGUF) is not supported" if swapped in (2, 3)
                        else f"version: {version} is not supported (2 or 3)")
    r.where = "tensor_count"
    n_tensors = r.scalar("Q")
    r.where = "kv_count"
    n_kv = r.scalar("Q")
    if n_tensors > MAX_COUNT or n_kv > MAX_COUNT:
        raise GGUFError(f"{'tensor_count' if n_tensors > MAX_COUNT else 'kv_count'}: "
                        f"{max(n_tensors, n_kv)} is not a plausible count")
    r.where = "header"
    r.check_room("tensor_count", n_tensors, _MIN_TENSOR_INFO_BYTES)
    r.check_room("kv_count", n_kv, _MIN_ENTRY_BYTES)
    metadata: dict[str, Any] = {}
    for index in range(n_kv):
        r.where = f"metadata entry {index}"
        key = r.string()
        r.where = f"metadata {key}"
        metadata[key] = r.value(r.scalar("I"))
    tensors = [_tensor_info(r, index) for index in range(n_tensors)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"general.alignment: {alignment!r} is not a power of two")
    data_offset = -(-r.pos // alignment) * alignment
    header = GGUFHeader(version, metadata, tuple(tensors), data_offset)
    if file_size is not None:
        _check_extents(header, file_size)
    return header


def _tensor_info(r: _Reader, index: int) -> TensorInfo:
    r.where = f"tensor {index}"
    name = r.string()
    r.where = f"tensor {name}"
    n_dims = r.scalar("I")
    if not 1 <= n_dims <= 4:
        raise GGUFError(f"tensor {name}: {n_dims} dimensions")
    dims = [r.scalar("Q") for _ in range(n_dims)]
    ggml_type, offset = r.scalar("I"), r.scalar("Q")
    if ggml_type not in GGML_TYPES:
        raise GGUFError(f"tensor {name}: unknown ggml type {ggml_type}")
    type_name, block, _ = GGML_TYPES[ggml_type]
    if any(d <= 0 for d in dims) or dims[0] % block:
        raise GGUFError(f"tensor {name}: shape {dims} does not hold whole {type_name} blocks of {block}")
    return TensorInfo(name, tuple(reversed(dims)), ggml_type, offset)


def _check_extents(header: GGUFHeader, file_size: int) -> None:
    room = file_size - header.data_offset
    for t in header.tensors:
        if t.offset + t.nbytes > room:
            raise GGUFError(f"tensor {t.name}: its data ({t.nbytes} bytes at {t.offset}) runs past "
                            f"the end of the file ({file_size} bytes)")
