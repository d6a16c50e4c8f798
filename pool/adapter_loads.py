"""LoRA adapters brought into a replica for the requests that name them.

A request for an adapter its replica lacks waits for the adapter's two files (from
the node's weight cache, fetched from S3 into it first when absent, each object as
it was attached: another ETag or size is refused) and their upload into the
replica (PUT /admin/adapters/{name}: wire/replica_control.py), which reads and
installs them between engine steps, so the replica's running requests never
pause. Requests that need the same load at once share it. Making room first drops
the least recently used adapters no lease uses (pool/adapter_holdings.py).

The config always travels in a header. The weights go by the replica's adapter inbox
where its handle has one (`upload`: linked from the cache, named in the PUT, unlinked
after the reply; pool/adapter_inbox.py), which spares them the trip through HTTP that
was half a load's time (benchmarks/adapter_load.py); else as the PUT's body.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import httpx

from pool.adapter_holdings import AdapterHoldings
from pool.adapter_inbox import delivered
from pool.api import AdapterLoadFailed, AdapterLoadTimings, AdapterRef, AdapterRefused, ColdStartFailed
from pool.backends.base import ReplicaHandle
from pool.s3 import S3Object, parse_uri
from pool.weights.sources import SourceStores
from spec.lora_adapter import CONFIG_FILE, WEIGHTS_FILE
from wire.errors import message_of
from wire.replica_control import ADAPTER_CONFIG_HEADER, ADAPTER_FILE_HEADER, ADAPTERS_PATH, AdapterReply, BadReply


@dataclass(frozen=True)
class AdapterFiles:
    config: bytes                    # adapter_config.json
    weights: Path                    # adapter_model.safetensors, in the node's cache
    weight_bytes: int
    downloaded_bytes: int
    seconds: float


class AdapterLoads:
    def __init__(self, stores: SourceStores, http: httpx.AsyncClient, *, capacity: int, timeout_s: float):
        self.stores = stores
        self.http = http
        self.capacity = capacity        # adapters one replica is given at most
        self.timeout_s = timeout_s
        # (replica, adapter) -> the load in flight, shared by every request that needs it
        self._loading: dict[tuple[str, str], asyncio.Task[AdapterLoadTimings]] = {}

    async def ensure(self, replica_id: str, handle: ReplicaHandle, holdings: AdapterHoldings,
                     ref: AdapterRef) -> Optional[AdapterLoadTimings]:
        """None when the replica holds the adapter; else the load's timings once it does."""
        if holdings.holds(ref.name):
            return None
        started = time.perf_counter()
        key = (replica_id, ref.name)
        task = self._loading.get(key)
        if task is None:
            task = asyncio.ensure_future(self._load(handle, holdings, ref))
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        timings = await asyncio.shield(task)
        return AdapterLoadTimings(timings.download_s, timings.downloaded_bytes, timings.install_s,
                                  time.perf_counter() - started)

    async def _load(self, handle: ReplicaHandle, holdings: AdapterHoldings,
                    ref: AdapterRef) -> AdapterLoadTimings:
        files = await self.files(ref)
        started = time.perf_counter()
        for victim in holdings.to_evict(ref.name, self.capacity):
            await self._drop(handle, holdings, victim)
        await upload(self.http, handle, ref.name, files, self.timeout_s)
        holdings.added(ref.name, files.weight_bytes)
        return AdapterLoadTimings(files.seconds, files.downloaded_bytes, time.perf_counter() - started)

    async def files(self, ref: AdapterRef) -> AdapterFiles:
        """The adapter's config and weights, through the node's cache, as attached."""
        started = time.perf_counter()
        store = await self.stores.store_for(ref.tenant_id, ref.uri)
        bucket, prefix = parse_uri(ref.uri)
        objects = [_pinned(ref, bucket, prefix + name, store.origin) for name in (CONFIG_FILE, WEIGHTS_FILE)]
        hits = [o in store.cache for o in objects]
        try:
            paths = await asyncio.wait_for(asyncio.gather(*(store.fetch_object(o) for o in objects)),
                                           self.timeout_s)
        except ColdStartFailed as exc:
            raise AdapterLoadFailed(f"adapter files: {exc}") from None
        except (asyncio.TimeoutError, OSError) as exc:
            raise AdapterLoadFailed(f"adapter files: S3 did not answer ({type(exc).__name__})") from None
        config = await asyncio.to_thread(paths[0].read_bytes)
        downloaded = sum(o.size for o, hit in zip(objects, hits) if not hit)
        return AdapterFiles(config, paths[1], objects[1].size, downloaded, time.perf_counter() - started)

    async def _drop(self, handle: ReplicaHandle, holdings: AdapterHoldings, name: str) -> None:
        """Take an idle adapter back; one the replica still runs (409) stays held."""
        try:
            resp = await self.http.delete(f"{handle.base_url}{ADAPTERS_PATH}/{name}", headers=handle.headers)
        except httpx.HTTPError:
            return
        if resp.status_code in (200, 404):
            holdings.dropped(name)


def _pinned(ref: AdapterRef, bucket: str, key: str, origin: str) -> S3Object:
    uri = f"s3://{bucket}/{key}"
    pin = ref.pins.get(uri)
    if pin is None:
        raise AdapterLoadFailed(f"adapter {ref.name}: {uri} was not read when it was attached")
    return S3Object(bucket, key, pin.size, pin.etag, origin)


async def upload(http: httpx.AsyncClient, handle: ReplicaHandle, name: str, files: AdapterFiles,
                 timeout_s: float) -> AdapterReply:
    """PUT the adapter into the replica: its weights by its inbox where the handle names
    one, else as the body. AdapterRefused for what the replica refused in it (400),
    AdapterLoadFailed for anything else."""
    headers = {**handle.headers, ADAPTER_CONFIG_HEADER: _config_header(files.config)}
    url = f"{handle.base_url}{ADAPTERS_PATH}/{name}"
    if handle.adapter_inbox is None:
        body = await asyncio.to_thread(files.weights.read_bytes)
        return await _put(http, url, headers, body, timeout_s)
    try:
        async with delivered(handle.adapter_inbox, files.weights) as file_name:
            return await _put(http, url, {**headers, ADAPTER_FILE_HEADER: file_name}, b"", timeout_s)
    except OSError as exc:         # the cache entry or the inbox went (an eviction, a stop)
        raise AdapterLoadFailed(f"adapter files: not linked into the replica's inbox ({exc.strerror})",
                                retry_after_s=1.0) from None


def _config_header(config: bytes) -> str:
    try:    # one header line: compact, ASCII
        return json.dumps(json.loads(config), separators=(",", ":"), ensure_ascii=True)
    except ValueError:
        raise AdapterRefused(f"the adapter was refused: {CONFIG_FILE} is not JSON") from None


async def _put(http: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes,
               timeout_s: float) -> AdapterReply:
    try:
        resp = await http.put(url, content=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise AdapterLoadFailed(f"the replica did not take the adapter: {type(exc).__name__}",
                                retry_after_s=1.0) from None
    if resp.status_code == 400:
        raise AdapterRefused(f"the adapter was refused: {message_of(resp.content)}")
    if resp.status_code != 200:
        raise AdapterLoadFailed(f"the replica did not take the adapter ({resp.status_code}): "
                                f"{message_of(resp.content)}", retry_after_s=1.0)
    try:
        return AdapterReply.parse(resp.json())
    except (BadReply, ValueError):
        raise AdapterLoadFailed("the replica's answer to the adapter load is not one", 1.0) from None
