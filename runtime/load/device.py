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
by size (`deal`), so they finish together. The staging loop (`copy_staged`) is written
against a Link, CUDA's in service (`CudaLink`); a test's link on the CPU lands each copy
only when it is waited for, so a buffer refilled too early shows as wrong bytes.

A tensor stored in another dtype than the engine's is converted on the device after
its copy; a tensor-parallel shard copies only its rows (a column shard is made
contiguous on the host first). `plan_pieces`, `deal` and `copy_staged` are tested on any
machine; the CUDA copies run only where CUDA does (scripts/gpu_checks.py compares them
with safetensors' own load, byte for byte, and prints its GB/s).
"""
from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import torch

from runtime.load.stored_dtype import KeepDtype, converted

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
                     threads: int = THREADS, stage_bytes: int = STAGE_BYTES,
                     open_link: Callable[[str], Link] | None = None,
                     keep: KeepDtype | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """(name -> tensor on `device` in `dtype`, bytes moved) from host tensors (views of
    the mapped files). open_link(device): each worker's Link (default: CudaLink)."""
    opener = open_link or CudaLink.open
    copies = [Copy(name, source.contiguous(), torch.empty(source.shape, dtype=source.dtype, device=device))
              for name, source in tensors.items()]
    errors: list[BaseException] = []
    workers = [threading.Thread(target=_worker, args=([copies[i] for i in share], device, opener, stage_bytes,
                                                      errors),
                                name=f"weights-to-{device}-{n}", daemon=True)
               for n, share in enumerate(deal([c.nbytes for c in copies], threads)) if share]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    moved = sum(c.nbytes for c in copies)
    return {c.name: converted(c.name, c.target, dtype, keep) for c in copies}, moved


class Done(Protocol):
    """A copy sent over a Link: synchronize() returns once it has read its staging buffer."""

    def synchronize(self) -> None: ...


class Link(Protocol):
    """One worker's way to the device: host staging buffers and asynchronous copies out of them."""

    def staging(self, nbytes: int) -> torch.Tensor: ...

    def send(self, target: torch.Tensor, staged: torch.Tensor) -> Done: ...

    def drain(self) -> None:
        """Returns once every copy sent has landed."""


@dataclass(frozen=True)
class CudaLink:
    """Pinned staging buffers, copies on a CUDA stream of the worker's own (so that the
    workers' copies overlap each other and the CPU's memcpys)."""
    stream: torch.cuda.Stream

    @classmethod
    def open(cls, device: str) -> "CudaLink":
        return cls(torch.cuda.Stream(device))  # type: ignore[no-untyped-call]

    def staging(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def send(self, target: torch.Tensor, staged: torch.Tensor) -> Done:
        with torch.cuda.stream(self.stream):
            target.copy_(staged, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        done: Done = event
        return done

    def drain(self) -> None:
        self.stream.synchronize()


def _worker(copies: list[Copy], device: str, open_link: Callable[[str], Link], stage_bytes: int,
            errors: list[BaseException]) -> None:
    try:
        copy_staged(copies, open_link(device), stage_bytes)
    except BaseException as exc:  # noqa: BLE001 - raised again by stream_to_device
        errors.append(exc)


def copy_staged(copies: Sequence[Copy], link: Link, stage_bytes: int) -> None:
    """Every copy's bytes through two staging buffers taken in turn: a buffer is filled
    again only after the copy that read it last is done."""
    largest = max((c.nbytes for c in copies), default=0)
    size = max(1, min(stage_bytes, largest))
    buffers = [link.staging(size) for _ in range(2)]
    pending: list[Optional[Done]] = [None, None]
    turn = 0
    for copy in copies:
        source, target = _bytes(copy.source), _bytes(copy.target)
        for offset, length in plan_pieces(source.numel(), size):
            slot = turn % 2
            done = pending[slot]
            if done is not None:
                done.synchronize()                    # its last copy has read the buffer
            staged = buffers[slot][:length]
            staged.copy_(source[offset:offset + length])
            pending[slot] = link.send(target[offset:offset + length], staged)
            turn += 1
    link.drain()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)
