"""Weights onto a CUDA device at the link's bandwidth: pinned staging, overlapped copies.

The files are memory-mapped as for the CPU (runtime/load/weights.py), so a tensor's bytes are
read from the page cache where the node's weight cache put them, once. Each tensor is
copied into its final device tensor in pieces of at most `stage_bytes`: a worker thread
copies a piece from the mapping into one of its two pinned host buffers (a memcpy,
torch lets go of the GIL), issues the host-to-device copy of that buffer on its own
CUDA stream without waiting for it, and fills its other buffer meanwhile; a buffer is
reused only after the event of the copy that read it. `threads` workers keep that many
copies in flight over the PCIe link while the CPU side fills the next ones, as
fastsafetensors and Run:ai's model streamer do. Tensors are dealt out to the workers
by size (`deal`), so they finish together.

A tensor stored in another dtype than the engine's is converted on the device after
its copy; a tensor-parallel shard copies only its rows (a column shard is made
contiguous on the host first). `plan_pieces` and `deal` are pure and tested on any
machine; the copy itself runs only where CUDA does (scripts/gpu_checks.py compares it
with safetensors' own load, byte for byte, and prints its GB/s).
"""
from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

STAGE_BYTES = 32 << 20          # one pinned buffer; two per worker
THREADS = 4


@dataclass(frozen=True)
class Copy:
    """One tensor to move: its host view (contiguous) and its device destination."""
    name: str
    source: torch.Tensor
    target: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.source.numel() * self.source.element_size()


def plan_pieces(nbytes: int, stage_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each piece of a tensor of `nbytes`, none over `stage_bytes`."""
    if stage_bytes <= 0:
        raise ValueError("stage_bytes must be positive")
    return [(offset, min(stage_bytes, nbytes - offset)) for offset in range(0, nbytes, stage_bytes)]


def deal(sizes: Sequence[int], workers: int) -> list[list[int]]:
    """Indices of `sizes` per worker, largest first onto the least loaded (so the workers'
    byte totals differ by at most the largest item)."""
    loads = [(0, worker) for worker in range(max(1, workers))]
    dealt: list[list[int]] = [[] for _ in loads]
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        load, worker = heapq.heappop(loads)
        dealt[worker].append(index)
        heapq.heappush(loads, (load + sizes[index], worker))
    return dealt


def stream_to_device(tensors: dict[str, torch.Tensor], device: str, dtype: torch.dtype,
                     threads: int = THREADS, stage_bytes: int = STAGE_BYTES) -> tuple[dict[str, torch.Tensor], int]:
    """(name -> tensor on `device` in `dtype`, bytes moved) from host tensors (views of
    the mapped files)."""
    copies = [Copy(name, source.contiguous(), torch.empty(source.shape, dtype=source.dtype, device=device))
              for name, source in tensors.items()]
    errors: list[BaseException] = []
    workers = [threading.Thread(target=_worker, args=([copies[i] for i in share], device, stage_bytes, errors),
                                name=f"weights-to-{device}-{n}", daemon=True)
               for n, share in enumerate(deal([c.nbytes for c in copies], threads)) if share]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    moved = sum(c.nbytes for c in copies)
    return {c.name: c.target if c.target.dtype == dtype else c.target.to(dtype) for c in copies}, moved


def _worker(copies: list[Copy], device: str, stage_bytes: int, errors: list[BaseException]) -> None:
    try:
        _copy_all(copies, device, stage_bytes)
    except BaseException as exc:  # noqa: BLE001 - raised again by stream_to_device
        errors.append(exc)


def _copy_all(copies: list[Copy], device: str, stage_bytes: int) -> None:
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    largest = max(c.nbytes for c in copies)
    size = max(1, min(stage_bytes, largest))
    buffers = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    pending: list[Optional[torch.cuda.Event]] = [None, None]
    turn = 0
    with torch.cuda.stream(stream):
        for copy in copies:
            source, target = _bytes(copy.source), _bytes(copy.target)
            for offset, length in plan_pieces(source.numel(), size):
                slot = turn % 2
                done = pending[slot]
                if done is not None:
                    done.synchronize()                    # its last copy has read the buffer
                staged = buffers[slot][:length]
                staged.copy_(source[offset:offset + length])
                target[offset:offset + length].copy_(staged, non_blocking=True)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(stream)
                pending[slot] = event
                turn += 1
    stream.synchronize()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)
