"""Tokenizers a standby parsed ahead of its load, so the load does not wait for the parse.

Parsing tokenizer.json is the slowest part of a small model's ready path (~0.1 s of Rust
holding the GIL for a 49k BPE, longer than a 4-bit model's weights take to map). The pool
tells a standby the model folders it will likely load (wire/replica_control.py's
LikelyModels); the standby parses their tokenizers in the background, one at a time, and
`take` at the load hands over the one parsed from the very files the folder holds now.

A parse is keyed by the identity of both files a Tokenizer reads (tokenizer.json and
tokenizer_config.json): real path, size, mtime_ns and inode, taken before the parse (stat
follows the pool's symlinks into its content cache). A file changed since, or a parse
that failed, is parsed again at the load, where its error is reported as any load's is.
At most `capacity` parses are kept, the least likely dropped first.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from runtime.core.tokenizer import Tokenizer
from wire.replica_control import MAX_LIKELY_MODELS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class FileIdentity:
    path: str          # the real path: a symlink's target
    size: int
    mtime_ns: int
    inode: int


FilesIdentity = tuple[Optional[FileIdentity], ...]    # None: that file is not there


def file_identity(path: Path) -> Optional[FileIdentity]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileIdentity(os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)


def tokenizer_identity(model_dir: str) -> FilesIdentity:
    return tuple(file_identity(Path(model_dir) / name) for name in TOKENIZER_FILES)


@dataclass
class Parse:
    identity: FilesIdentity
    result: "asyncio.Future[Tokenizer]"


class ParsedTokenizers:
    def __init__(self, capacity: int = MAX_LIKELY_MODELS,
                 parse: Callable[[str], Tokenizer] = Tokenizer) -> None:
        self.capacity = capacity
        self._parse = parse
        self._parses: OrderedDict[str, Parse] = OrderedDict()   # model folder -> its parse
        self._one_at_a_time = asyncio.Lock()    # background parses share the GIL with the server

    def prepare(self, model_dirs: tuple[str, ...]) -> None:
        """Parse each folder's tokenizer in the background unless a parse of the same files
        is kept; the first named is parsed first and dropped last."""
        named = []
        for model_dir in model_dirs:
            kept = self._parses.get(model_dir)
            identity = tokenizer_identity(model_dir)
            if identity[0] is None:        # no tokenizer.json there: nothing to parse ahead
                continue
            if kept is None or kept.identity != identity or _failed(kept.result):
                result = asyncio.ensure_future(self._parse_in_turn(model_dir))
                result.add_done_callback(_failed)    # a failure is the load's to report, not the log's
                self._parses[model_dir] = Parse(identity, result)
            named.append(model_dir)
        for model_dir in reversed(named):
            self._parses.move_to_end(model_dir, last=False)
        while len(self._parses) > self.capacity:
            self._parses.popitem()[1].result.cancel()

    def prepared(self) -> tuple[str, ...]:
        """The folders whose parse is done and kept, most likely first."""
        return tuple(d for d, p in self._parses.items() if p.result.done() and not _failed(p.result))

    async def take(self, model_dir: str) -> tuple[Tokenizer, float]:
        """The folder's tokenizer, and the seconds the load waited for it: the kept parse of
        the same files (done, or awaited where under way), else a parse now. A replica
        loads one model in its life: the other parses are dropped, those not begun never
        take the CPU from the load."""
        start = time.perf_counter()
        kept = self._parses.pop(model_dir, None)
        self.close()
        if kept is not None and kept.identity == tokenizer_identity(model_dir):
            try:
                return await asyncio.shield(kept.result), time.perf_counter() - start
            except Exception:   # noqa: BLE001 - parsed again below, where the load reports it
                pass
        tokenizer = await asyncio.to_thread(self._parse, model_dir)
        return tokenizer, time.perf_counter() - start

    async def settled(self) -> None:
        """Until every background parse is done (or failed)."""
        await asyncio.gather(*(p.result for p in self._parses.values()), return_exceptions=True)

    def close(self) -> None:
        for kept in self._parses.values():
            kept.result.cancel()
        self._parses.clear()

    async def _parse_in_turn(self, model_dir: str) -> Tokenizer:
        async with self._one_at_a_time:
            return await asyncio.to_thread(self._parse, model_dir)


def _failed(result: "asyncio.Future[Tokenizer]") -> bool:
    return result.done() and (result.cancelled() or result.exception() is not None)
