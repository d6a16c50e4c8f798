"""glibc's malloc, set for a server that reads bodies of tens of megabytes (LoRA adapter
uploads, runtime/serve/adapters.py).

By default glibc maps each allocation above its threshold (128 KB, raised as such blocks
are freed, to at most 32 MB) to pages of its own and unmaps them on free, so every
upload's body is faulted in afresh, page by page, which takes longer than receiving it;
and it trims the heap's top beyond 128 KB free. Serving blocks of up to 64 MB from the
heap, and keeping up to 128 MB of it free before trimming, lets one upload reuse the
pages of the last (benchmarks/adapter_load.py's peer reads bodies the same way). What
this costs is up to 128 MB of freed heap kept by the server process, so only a replica
with adapter slots asks for it. A C library other than glibc is left as it is.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("thawpool.runtime")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc's malloc.h
HEAP_BLOCK_BYTES = 64 * 1024 * 1024
KEPT_FREE_BYTES = 128 * 1024 * 1024


def keep_large_blocks() -> bool:
    """Tune this process's malloc as above; False where it is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES) == 1)
    if not done:
        log.warning("mallopt refused the thresholds; adapter uploads fault in their pages afresh")
    return done
