"""A replica's adapter inbox, as the pool fills it: the folder of its sandbox bound
read-only at /srv/adapters inside (pool/model_sandbox.py), which the backend names on
the replica's handle (`ReplicaHandle.adapter_inbox`; None where there is none, as on
Ray, whose replicas may run on another machine than the pool's cache).

For one load the adapter's weights are hard-linked from the node's cache into it under
a name of their own (a copy where the link is refused: another filesystem), the PUT
names that file (wire/replica_control.py's ADAPTER_FILE_HEADER), and the link is removed
once the replica has answered: by then it has mapped the file, or given up on it. So
the inbox holds only the adapters being loaded into its replica, and a name is never
reused, so a late reader of an earlier load never sees another file.
"""
from __future__ import annotations

import asyncio
import secrets
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from pool.model_sandbox import link_or_copy
from spec.lora_adapter import WEIGHTS_FILE
from wire.replica_control import adapter_file


@asynccontextmanager
async def delivered(inbox: Path, weights: Path) -> AsyncIterator[str]:
    """`weights` linked into `inbox` for as long as the block runs: the file's name there."""
    name = adapter_file(f"{secrets.token_hex(8)}-{WEIGHTS_FILE}")
    target = inbox / name
    # in a thread: the copy a link may fall back on is the whole file; awaited to its end
    # even when the load is cancelled, so that no link is made after its removal
    linking = asyncio.ensure_future(asyncio.to_thread(link_or_copy, weights, target))
    try:
        await asyncio.shield(linking)
        yield name
    finally:
        await asyncio.gather(linking, return_exceptions=True)
        target.unlink(missing_ok=True)
