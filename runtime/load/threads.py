"""The threads of a load: a map over items on every usable CPU, and one job beside it.

The work handed to it (faulting in pages, torch copies, oneDNN reorders) lets go of the
GIL, so threads run it side by side; results come back in the items' order.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Optional, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def in_background(fn: Callable[..., R], *args: object) -> "Future[R]":
    """fn(*args) on a thread of its own, started now; .result() waits (and raises its error)."""
    future: Future[R] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(exc)
    threading.Thread(target=run, name="thawpool-background", daemon=True).start()
    return future


def parallel_map(fn: Callable[[T], R], items: Iterable[T], workers: Optional[int] = None) -> list[R]:
    """[fn(x) for x in items], on up to `workers` threads (default: one per usable CPU)."""
    todo = list(items)
    workers = min(workers or usable_cpus(), len(todo))
    if workers <= 1:
        return [fn(x) for x in todo]
    with ThreadPoolExecutor(workers, thread_name_prefix="thawpool-load") as pool:
        return list(pool.map(fn, todo))
