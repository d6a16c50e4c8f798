"""Load safetensors weights (single file or sharded with an index) into a model.

Files are memory-mapped by safetensors; each tensor is read once and converted
straight to the target dtype and device. Timings are reported per stage.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors import safe_open

from runtime.tensor_parallel import Shard

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def iter_weights(model_dir: str | Path, dtype: torch.dtype, device: str,
                 shard_of: Optional[Callable[[str], Optional[Shard]]] = None):
    """Yield (name, tensor) in the target dtype/device, one memory-mapped tensor at a time.

    shard_of(name): the rows or columns to read (tensor parallelism); only those bytes
    are read from the file, the rest of the tensor is never touched."""
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt", device=device) as f:   # read onto the device
            for name in f.keys():
                shard = shard_of(name) if shard_of is not None else None
                if shard is None:
                    yield name, f.get_tensor(name).to(dtype=dtype)
                    continue
                part = f.get_slice(name)
                index = slice(shard.start, shard.stop)
                yield name, (part[index] if shard.dim == 0 else part[:, index]).to(device=device, dtype=dtype)
