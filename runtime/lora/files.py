"""A PEFT adapter folder's two files, as bytes: what a PUT of /admin/adapters carries, and
what runtime/lora/adapter.py reads an adapter from. No torch: the server reads folders
(--lora-modules) before it has imported it."""
from __future__ import annotations

from pathlib import Path
from typing import Union

from spec.lora_adapter import CONFIG_FILE, WEIGHTS_FILE


def adapter_files(folder: Union[str, Path]) -> tuple[bytes, bytearray]:
    """adapter_config.json, and adapter_model.safetensors in a writable buffer (its tensors
    are read in place); ValueError naming the file that is missing."""
    folder = Path(folder)
    config, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for path in (config, weights):
        if not path.is_file():
            raise ValueError(f"adapter: no {path.name} in {folder}")
    body = bytearray(weights.stat().st_size)
    with open(weights, "rb") as f:
        f.readinto(body)
    return config.read_bytes(), body
