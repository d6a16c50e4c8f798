"""What slots this node has: CUDA devices, or declared CPU slots.

CUDA is probed in a short child process so that torch (and a CUDA context)
never enters the control-plane process.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Optional

from pool.settings import GB, PoolSettings

_PROBE = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([torch.cuda.get_device_properties(i).total_memory for i in range(n)]))\n"
)


@dataclass(frozen=True)
class Slot:
    slot_id: str
    node: str
    kind: str                      # cuda | cpu
    memory_bytes: int
    device_index: Optional[int] = None
    exclusive: bool = False        # one replica at a time: a Ray actor holds whole GPUs


def discover_slots(settings: PoolSettings) -> list[Slot]:
    if settings.accelerator in ("auto", "cuda"):
        cuda = cuda_slots(settings)
        if cuda or settings.accelerator == "cuda":
            return cuda
    return cpu_slots(settings)


def cpu_slots(settings: PoolSettings) -> list[Slot]:
    memory = int(settings.slot_memory_gb * GB)
    return [Slot(f"{settings.node}/cpu{i}", settings.node, "cpu", memory)
            for i in range(settings.cpu_slots)]


def cuda_slots(settings: PoolSettings) -> list[Slot]:
    memories = probe_cuda(settings.runtime_python)
    return [Slot(f"{settings.node}/cuda{i}", settings.node, "cuda", mem, i)
            for i, mem in enumerate(memories)]


def probe_cuda(python: str, timeout_s: float = 120.0) -> list[int]:
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                             timeout=timeout_s, check=True)
        return [int(m) for m in json.loads(out.stdout.strip().splitlines()[-1])]
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return []
