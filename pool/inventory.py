"""What slots this node has: CUDA devices, or declared CPU slots.

CUDA is probed in a short child process so that torch (and a CUDA context)
never enters the control-plane process. A GPU slot also carries its type (`gpu_kind`:
h100, a100, l4, ...), read from the device's name or set for the node
(THAWPOOL_GPU_KIND): the replica events name it, and the cost book prices GPU time by it
(controlplane/billing/costs.py), so an H100 second and an L4 second cost what each does.
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
    "props = [torch.cuda.get_device_properties(i) for i in range(n)]\n"
    "print(json.dumps([[p.total_memory, p.name] for p in props]))\n"
)
VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
SERIES_WORDS = frozenset({"rtx", "gtx"})          # a type of two words: rtx-4090


@dataclass(frozen=True)
class Slot:
    slot_id: str
    node: str
    kind: str                      # cuda | cpu
    memory_bytes: int
    device_index: Optional[int] = None
    exclusive: bool = False        # one replica at a time: a Ray actor holds whole GPUs
    gpu_kind: str = ""             # the GPU's type (h100, ...); "": unknown, priced as `kind`

    @property
    def cost_kind(self) -> str:
        """What the cost book prices this slot's time as."""
        return self.gpu_kind or self.kind


def accelerator_type(device_name: str) -> str:
    """A GPU's type from CUDA's name for it, as operators price GPUs: the model without
    the vendor, its memory or its form factor. "NVIDIA H100 80GB HBM3" -> h100,
    "NVIDIA A100-SXM4-80GB" -> a100, "Tesla T4" -> t4, "NVIDIA GeForce RTX 4090" ->
    rtx-4090; "" for a name with no model in it."""
    words = [w for w in device_name.lower().split() if w not in VENDOR_WORDS]
    if not words:
        return ""
    model = words[0].split("-")[0]
    if model in SERIES_WORDS and len(words) > 1:
        return f"{model}-{words[1]}"
    return model


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
    return slots_of_devices(probe_cuda(settings.runtime_python), settings)


def slots_of_devices(devices: list[tuple[int, str]], settings: PoolSettings) -> list[Slot]:
    """One slot per (memory bytes, device name) the probe found, typed as the node says
    (PoolSettings.gpu_kind) or as the name does."""
    return [Slot(f"{settings.node}/cuda{i}", settings.node, "cuda", memory, i,
                 gpu_kind=settings.gpu_kind or accelerator_type(name))
            for i, (memory, name) in enumerate(devices)]


def probe_cuda(python: str, timeout_s: float = 120.0) -> list[tuple[int, str]]:
    """Each CUDA device's memory in bytes and its name; none where CUDA is not."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                             timeout=timeout_s, check=True)
        return [(int(memory), str(name)) for memory, name in json.loads(out.stdout.strip().splitlines()[-1])]
    except (subprocess.SubprocessError, OSError, ValueError, IndexError, TypeError):
        return []
