"""C kernel calls as objects: a Kernel is called with tensors where its C function takes
pointers, and inside `recording(tape)` each call is also noted on the tape, with the
tensors it was given kept alive, so that making the same calls again later computes on
whatever those tensors then hold (runtime/engine/cpu_replay.py replays a decode step's
layers this way, as a CUDA graph replays its launches).
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from torch import Tensor


@dataclass(frozen=True)
class Call:
    """One call of a C function as it was made, its pointers resolved: `call()` makes it
    again, on the memory they name."""
    fn: ctypes._CFuncPtr
    args: tuple[Any, ...]

    def __call__(self) -> Any:
        return self.fn(*self.args)


class Tape:
    """The calls made inside `recording(tape)`, in order, and the tensors they were given."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.kept: list[Tensor] = []


# The tape of the recording under way in this thread's context, if any: a dynamic
# extent, as torch.cuda.graph's capture is, rather than an argument every kernel wrapper
# would pass down.
_RECORDING: ContextVar[Optional[Tape]] = ContextVar("thawpool_kernel_tape", default=None)


@contextmanager
def recording(tape: Tape) -> Iterator[Tape]:
    """Every Kernel called inside is also noted on `tape`."""
    token = _RECORDING.set(tape)
    try:
        yield tape
    finally:
        _RECORDING.reset(token)


class Kernel:
    """A C function of a kernel library (kernels/cpu/build.py:function): a tensor argument
    is passed as its data pointer; returns what the function returns (its status, where
    it has one)."""

    def __init__(self, fn: ctypes._CFuncPtr):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        resolved = [a.data_ptr() if isinstance(a, Tensor) else a for a in args]
        tape = _RECORDING.get()
        if tape is not None:
            tape.calls.append(Call(self.fn, tuple(resolved)))
            tape.kept.extend(a for a in args if isinstance(a, Tensor))
        return self.fn(*resolved)
