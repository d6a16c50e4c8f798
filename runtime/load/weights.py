"""Load safetensors weights (single file or sharded with an index) into memory.

On the CPU the weights' final place is the page cache the node's weight cache already
fills: each file is memory-mapped (privately: a write would copy the page, never reach
the file) and every tensor is a view of the mapping, so no byte is copied. The mapping is
then populated, every page faulted in by several threads at once, so the `weights` stage
moves the bytes at the memory's (or the disk's) bandwidth, reports them for the GB/s in
the load timings, and nothing later waits on I/O. A tensor stored in another dtype than
the engine's is converted (one copy); a tensor-parallel shard is a view of its rows or
columns.

On CUDA the same mapped views are streamed to the device through pinned staging
buffers by several threads (runtime/load/device.py); `iter_weights`, safetensors'
own read onto the device, is the reference it is checked against.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from safetensors import safe_open

from runtime.load.device import stream_to_device
from runtime.load.stored_dtype import KeepDtype, converted
from runtime.load.timings import LoadTimings
from runtime.load.threads import parallel_map
from runtime.load.safetensors_layout import PREFIX_BYTES, TensorEntry, chunks, header_length, parse_header
from runtime.tensor_parallel.shards import Shard

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PAGE = mmap.PAGESIZE
POPULATE_CHUNK = 32 << 20          # bytes one thread faults in at a time
ShardOf = Callable[[str], Optional[Shard]]


def weight_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise ValueError(f"model: no safetensors weights in {model_dir}")
    return found


def read_weights(model_dir: str | Path, dtype: torch.dtype, device: str, timings: LoadTimings,
                 shard_of: Optional[ShardOf] = None, keep: Optional[KeepDtype] = None) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint by name, in `dtype` on `device` (but for the parts
    of quantized weights: `converted`); the `weights` stage.

    shard_of(name): the rows or columns of it this rank keeps (tensor parallelism)."""
    since = time.perf_counter()
    if torch.device(device).type == "cpu":
        tensors, moved = mapped_weights(model_dir, dtype, shard_of, keep)
    else:
        tensors, moved = _onto_device(model_dir, dtype, device, shard_of, keep)
    timings.weight_bytes += moved
    timings.record("weights", since)
    return tensors


def _onto_device(model_dir: str | Path, dtype: torch.dtype, device: str, shard_of: Optional[ShardOf] = None,
                 keep: Optional[KeepDtype] = None) -> tuple[dict[str, torch.Tensor], int]:
    """The staged loader; safetensors' own read if it fails. The staged path has not run on
    a GPU yet (make gpu-check compares the two), so a failure of it must not fail a load."""
    try:
        views, _ = host_views(model_dir, shard_of, populate_pages=False)
        return stream_to_device(views, device, dtype, keep=keep)
    except (RuntimeError, OSError) as exc:
        log.warning("staged weight loading failed (%s: %s); reading with safetensors instead",
                    type(exc).__name__, exc)
        tensors = dict(iter_weights(model_dir, dtype, device, shard_of, keep))
        return tensors, sum(t.numel() * t.element_size() for t in tensors.values())


def mapped_weights(model_dir: str | Path, dtype: torch.dtype, shard_of: Optional[ShardOf] = None,
                   keep: Optional[KeepDtype] = None) -> tuple[dict[str, torch.Tensor], int]:
    """(name -> CPU tensor viewing the mapped file, bytes populated)."""
    views, moved = host_views(model_dir, shard_of)
    return {name: converted(name, tensor, dtype, keep) for name, tensor in views.items()}, moved


def host_views(model_dir: str | Path, shard_of: Optional[ShardOf] = None,
               populate_pages: bool = True) -> tuple[dict[str, torch.Tensor], int]:
    """(name -> tensor in its stored dtype viewing the mapped file, bytes populated); with
    populate_pages False the pages are faulted in by whoever reads them (the device
    loader's staging copies)."""
    tensors: dict[str, torch.Tensor] = {}
    moved = 0
    for path in weight_files(model_dir):
        mapping, entries = map_file(path)
        if populate_pages:
            moved += populate(mapping)
        for entry in entries:
            tensors[entry.name] = _sharded(tensor_view(mapping, entry),
                                           shard_of(entry.name) if shard_of else None)
    return tensors, moved


def map_file(path: Path) -> tuple[mmap.mmap, list[TensorEntry]]:
    with open(path, "rb") as f:
        header = f.read(header_length(f.read(PREFIX_BYTES)))
        entries = parse_header(header, os.fstat(f.fileno()).st_size)
        mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mapping, entries


def populate(mapping: mmap.mmap) -> int:
    """Fault in every page of the mapping, several threads at once; returns its bytes."""
    mapping.madvise(mmap.MADV_WILLNEED)       # from a disk: the kernel starts reading ahead
    pages = torch.frombuffer(mapping, dtype=torch.uint8)
    # one byte of every page read is enough to map it; torch lets go of the GIL meanwhile
    parallel_map(lambda piece: int(pages[piece[0]:piece[0] + piece[1]:PAGE].sum()),
                 chunks(0, len(mapping), POPULATE_CHUNK))
    return len(mapping)


def tensor_view(mapping: mmap.mmap, entry: TensorEntry) -> torch.Tensor:
    """The tensor in place in the mapping (a copy only if its start is misaligned)."""
    dtype = getattr(torch, entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype)
    if not entry.aligned:
        raw = torch.frombuffer(mapping, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
        return raw.clone().view(dtype).view(entry.shape)
    return torch.frombuffer(mapping, dtype=dtype, count=entry.nbytes // entry.itemsize,
                            offset=entry.offset).view(entry.shape)


def _sharded(tensor: torch.Tensor, shard: Optional[Shard]) -> torch.Tensor:
    if shard is None:
        return tensor
    part = tensor.narrow(shard.dim, shard.start, shard.stop - shard.start)
    return part if shard.dim == 0 else part.contiguous()    # columns: the kernels want rows whole


def iter_weights(model_dir: str | Path, dtype: torch.dtype, device: str, shard_of: Optional[ShardOf] = None,
                 keep: Optional[KeepDtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) read by safetensors onto `device`, one tensor at a time.

    shard_of(name): the rows or columns to read (tensor parallelism); only those bytes
    are read from the file, the rest of the tensor is never touched."""
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt", device=device) as f:   # read onto the device
            for name in f.keys():
                shard = shard_of(name) if shard_of is not None else None
                if shard is None:
                    yield name, converted(name, f.get_tensor(name), dtype, keep)
                    continue
                part = f.get_slice(name)
                index = slice(shard.start, shard.stop)
                yield name, converted(name, (part[index] if shard.dim == 0 else part[:, index]).to(device),
                                      dtype, keep)
