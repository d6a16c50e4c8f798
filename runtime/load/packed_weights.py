"""A node's cache of layer weights as the CPU kernels want them: packed for oneDNN (or
quantized to int8), so that a replica of a model the node has loaded before maps them in
place of fusing and packing them again (issue 22: packing was 0.22 s of a warm standby's
0.36 s on SmolLM2, and grows with the model).

oneDNN's packed weight is an opaque tensor (a blocked layout oneDNN picks for the CPU),
which torch can neither save nor build from bytes in Python. It can through the C shim
that torch's ahead-of-time compiler (AOTInductor) uses for its own packed constants:
`torch.ops.mkldnn._get_mkldnn_serialized_md` gives a packed tensor's layout descriptor,
`aoti_torch_create_tensor_from_blob_v2` (libtorch_cpu) rebuilds one over given memory, and
`torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr` hands it to Python. The rebuilt
tensor reads the memory where it is, here a mapping of the cache file: no copy, and its
pages are the page cache's, shared by every replica of the model on the node.

A file holds one tensor-parallel rank's layers (`LayerWeights` fields: packed, dense or
Int8Weight), under a key of what makes its bytes: each weight file's resolved path (the
node's weight cache names entries by the object's ETag), size and mtime, the model class,
dtype, quantization, rank, torch's version and the CPU (model name and flags: a blocked
layout is chosen for the CPU it was packed on). Layout: MAGIC, the JSON header's length
(8 bytes, little-endian) and the header, then every blob at a multiple of ALIGN. Files
are written whole to a temporary name and renamed, so a reader sees all of one or none;
beyond `budget_bytes` the least recently used go (a replica that mapped one keeps its pages).
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import mmap
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from runtime.load.weights import populate, weight_files
from kernels.fp8 import Fp8Weight
from kernels.group_quant import GroupQuantized
from runtime.load.quantization import Int8Weight, RowStack

log = logging.getLogger(__name__)

MAGIC = b"THAWPACK1\n"
ALIGN = 4096
TEMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class MappedLayers:
    """Layers read from a cache file; their packed and int8 tensors live in `mapping`,
    which must outlive them (the model keeps it)."""
    layers: list[Any]
    mapping: mmap.mmap
    nbytes: int


def cache_key(model_dir: str | Path, identity: dict[str, Any]) -> str:
    """What makes a file's bytes: the weight files as the node holds them, and `identity`
    (model class, dtype, quantization, rank, ...), the torch build and the CPU."""
    from kernels.cpu.build import cpu_identity

    files = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in weight_files(model_dir)]
    what = {"files": files, "identity": identity, "torch": torch.__version__, "cpu": cpu_identity()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


class PackedWeightCache:
    def __init__(self, root: str | Path, budget_bytes: int):
        self.root, self.budget_bytes = Path(root), budget_bytes

    def path(self, key: str) -> Path:
        return self.root / f"{key}.pack"

    def load(self, key: str, layer_type: Callable[..., Any]) -> Optional[MappedLayers]:
        """The cached layers under `key`, or None when there are none (or the file is not
        one this code wrote: it is then left for the next store to replace)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                header = _read_header(f)
                mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                    prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("packed weights %s unreadable, packing afresh: %s", path, exc)
            return None
        nbytes = populate(mapping)         # every page mapped now, not in the first forward
        base = _address(mapping)
        layers = [layer_type(**{name: _rebuild(entry, mapping, base) for name, entry in fields.items()})
                  for fields in header["layers"]]
        try:
            os.utime(path)                 # recently used: the last to be evicted
        except PermissionError:            # a sandbox's read-only link: the pool keeps the order
            pass
        return MappedLayers(layers, mapping, nbytes)

    def store(self, key: str, layers: Sequence[Any]) -> int:
        """Writes the layers under `key` (whole, then renamed); returns the bytes written."""
        self.root.mkdir(parents=True, exist_ok=True)
        header, blobs, end = _layout(layers)
        temp = self.root / f"{key}.{os.getpid()}{TEMP_SUFFIX}"
        try:
            with open(temp, "wb") as f:
                encoded = json.dumps(header).encode()
                f.write(MAGIC + len(encoded).to_bytes(8, "little") + encoded)
                for offset, view in blobs:
                    f.seek(offset)
                    f.write(view)
                f.truncate(end)
            os.replace(temp, self.path(key))
        finally:
            temp.unlink(missing_ok=True)
        self._evict(keep=self.path(key))
        return end

    def _evict(self, keep: Path) -> None:
        """Least recently used files first, until the rest fit the budget; a temporary
        file of a writer that died is removed on sight."""
        files = []
        for p in self.root.iterdir():
            if p.name.endswith(TEMP_SUFFIX) and not _writer_alive(p):
                p.unlink(missing_ok=True)
            elif p.suffix == ".pack":
                files.append((p.stat().st_mtime, p.stat().st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.budget_bytes:
                break
            if p != keep:
                p.unlink(missing_ok=True)
                total -= size


def available() -> bool:
    """Whether this torch can rebuild a packed tensor from bytes (the AOTInductor shim)."""
    try:
        _shim()
    except (OSError, AttributeError, IndexError):
        return False
    return hasattr(torch._C, "_aoti") and hasattr(torch.ops.mkldnn, "_get_mkldnn_serialized_md")


# ---- the file's layout


def _layout(layers: Sequence[Any]) -> tuple[dict[str, Any], list[tuple[int, memoryview]], int]:
    """(header, [(offset, bytes)], file size): every blob placed at a multiple of ALIGN
    after room for the header (whose size depends on the offsets: placed after a guess,
    grown and redone if the guess was short)."""
    room = ALIGN
    while True:
        placer = _Placer(room)
        header = {"layers": [{f.name: _entry(getattr(layer, f.name), placer.place)
                              for f in dataclasses.fields(layer)} for layer in layers]}
        needed = len(MAGIC) + 8 + len(json.dumps(header).encode())
        if needed <= room:
            return header, placer.blobs, placer.end
        room = _aligned(needed)


class _Placer:
    """Hands out the offsets of blobs, each at a multiple of ALIGN from `start` on."""

    def __init__(self, start: int):
        self.end = start
        self.blobs: list[tuple[int, memoryview]] = []

    def place(self, view: memoryview) -> int:
        offset = self.end
        self.blobs.append((offset, view))
        self.end = _aligned(offset + view.nbytes)
        return offset


# the quantized kinds of weight (runtime/load/quantization.py), each a dataclass of
# tensors and plain numbers, stored field by field
STRUCTS: dict[str, type] = {"int8": Int8Weight, "group": GroupQuantized, "fp8": Fp8Weight}


def _entry(value: Any, place: Callable[[memoryview], int]) -> Optional[dict[str, Any]]:
    if value is None:
        return None
    if isinstance(value, RowStack):
        return {"kind": "rows", "parts": [_entry(part, place) for part in value.parts]}
    kind = next((k for k, cls in STRUCTS.items() if isinstance(value, cls)), None)
    if kind is not None:
        return {"kind": kind, "fields": {f.name: _field(getattr(value, f.name), place)
                                         for f in dataclasses.fields(value) if f.init}}
    if value.is_mkldnn:
        md = torch.ops.mkldnn._get_mkldnn_serialized_md(value)
        nbytes = torch.ops.mkldnn._nbytes(value)
        view = memoryview((ctypes.c_char * nbytes).from_address(torch.ops.mkldnn.data_ptr(value))).cast("B")
        return {"kind": "mkldnn", "shape": list(value.shape), "dtype": _dtype_name(value.dtype),
                "md": md.tolist(), "offset": place(view), "nbytes": nbytes}
    dense = value.contiguous()
    view = memoryview(dense.view(torch.uint8).numpy()).cast("B") if dense.numel() else memoryview(b"")
    return {"kind": "dense", "shape": list(dense.shape), "dtype": _dtype_name(dense.dtype),
            "offset": place(view), "nbytes": view.nbytes}


def _field(value: Any, place: Callable[[memoryview], int]) -> Any:
    return {"value": value} if value is None or isinstance(value, int) else _entry(value, place)


def _rebuild(entry: Optional[dict[str, Any]], mapping: mmap.mmap, base: int) -> Any:
    if entry is None:
        return None
    if entry["kind"] == "rows":
        return RowStack(tuple(_rebuild(part, mapping, base) for part in entry["parts"]))
    if entry["kind"] in STRUCTS:
        return STRUCTS[entry["kind"]](**{name: field["value"] if "value" in field else _rebuild(field, mapping, base)
                                         for name, field in entry["fields"].items()})
    if entry["kind"] == "mkldnn":
        return _mkldnn_at(base + entry["offset"], entry["shape"], getattr(torch, entry["dtype"]),
                          bytes(entry["md"]))
    dtype = getattr(torch, entry["dtype"])
    if entry["nbytes"] == 0:
        return torch.empty(entry["shape"], dtype=dtype)
    with warnings.catch_warnings():      # a private mapping is writable; torch cannot tell
        warnings.simplefilter("ignore")
        raw = torch.frombuffer(mapping, dtype=torch.uint8, count=entry["nbytes"], offset=entry["offset"])
    return raw.view(dtype).view(entry["shape"])


def _read_header(f) -> dict[str, Any]:
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a packed-weights file of this version")
    length = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(length))
    if not isinstance(header, dict) or not isinstance(header.get("layers"), list):
        raise ValueError("header has no layers")
    return header


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _address(mapping: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(mapping))


def _writer_alive(temp: Path) -> bool:
    pid = temp.name[:-len(TEMP_SUFFIX)].rsplit(".", 1)[-1]
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


# ---- oneDNN tensors from bytes, through AOTInductor's C shim


class _Shim:
    def __init__(self, lib: ctypes.CDLL):
        self.create = lib.aoti_torch_create_tensor_from_blob_v2
        self.create.restype = ctypes.c_int32
        self.create.argtypes = ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.POINTER(ctypes.c_int64)] * 2
                                + [ctypes.c_int64] + [ctypes.c_int32] * 3 + [ctypes.POINTER(ctypes.c_void_p),
                                                                              ctypes.c_int32, ctypes.c_char_p,
                                                                              ctypes.c_int64])
        for name in ("aoti_torch_layout__mkldnn", "aoti_torch_device_type_cpu", "aoti_torch_dtype_float32",
                     "aoti_torch_dtype_bfloat16"):
            getattr(lib, name).restype = ctypes.c_int32
        self.layout = lib.aoti_torch_layout__mkldnn()
        self.cpu = lib.aoti_torch_device_type_cpu()
        self.dtypes = {torch.float32: lib.aoti_torch_dtype_float32(),
                       torch.bfloat16: lib.aoti_torch_dtype_bfloat16()}
        capsule = ctypes.pythonapi.PyCapsule_New
        capsule.restype = ctypes.py_object
        capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = capsule


@functools.cache
def _shim() -> _Shim:
    """The shim's functions, looked up once per process."""
    return _Shim(ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")))


def _mkldnn_at(address: int, shape: Iterable[int], dtype: torch.dtype, md: bytes) -> torch.Tensor:
    """A packed (oneDNN) tensor over the bytes at `address`, laid out as `md` says."""
    shim = _shim()
    dims = list(shape)
    sizes = (ctypes.c_int64 * len(dims))(*dims)
    strides = (ctypes.c_int64 * len(dims))(*_contiguous_strides(dims))
    handle = ctypes.c_void_p()
    status = shim.create(address, len(dims), sizes, strides, 0, shim.dtypes[dtype], shim.cpu, 0,
                         ctypes.byref(handle), shim.layout, md, len(md))
    if status != 0 or not handle.value:
        raise RuntimeError(f"packed weights: torch could not rebuild a {dtype} tensor of shape {dims}")
    return torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(shim.capsule(handle.value, None, None))


def _contiguous_strides(dims: list[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return strides[::-1]
