"""Float32 buffers in shared memory, for adapters read in the server process and sent to
the engine core (runtime/serve/adapters.py): across the pipe, torch's pickler passes a
storage already in shared memory as one file descriptor, with nothing to copy.

One buffer is kept ready, every page touched, in the size of the last one taken: a fresh
segment's first writes fault its pages in one at a time, which costs more than the copy
that fills them, and the adapters of one base mostly share a size. The buffer a load takes is the engine's from
then on; the next is prepared off the load's path (`refill`, in a worker thread).
"""
from __future__ import annotations

import threading
from typing import Optional

import torch


class SharedBuffers:
    """Thread-safe: taken in one load's worker thread, refilled in another."""

    def __init__(self) -> None:
        self._ready: Optional[torch.Tensor] = None
        self._lock = threading.Lock()

    def take(self, elements: int) -> torch.Tensor:
        """An uninitialized [elements] float32 buffer in shared memory, the ready one if it fits."""
        with self._lock:
            ready, self._ready = self._ready, None
        return ready if ready is not None and ready.numel() == elements else shared_empty(elements)

    def refill(self, elements: int) -> None:
        """Have the next take(elements) find its buffer ready."""
        buffer = shared_empty(elements).zero_()      # every page touched now, not during a load
        with self._lock:
            self._ready = buffer


def shared_empty(elements: int) -> torch.Tensor:
    # allocated in shared memory at once: share_memory_() would copy a buffer made first
    storage = torch.UntypedStorage._new_shared(elements * 4)
    return torch.empty(0).set_(storage, 0, (elements,), (1,))
