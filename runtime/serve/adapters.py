"""The replica's LoRA adapters, as the pool loads and unloads them (wire/replica_control.py's
/admin/adapters): which names are loaded, from which bytes, and the way an adapter's two
files become an adapter in the engine.

A PUT's files (its weights a body, or a file of the adapter inbox mapped:
runtime/serve/adapter_inbox.py) are checked by spec/lora_adapter.py's rules and turned
into a LoraAdapter (runtime/lora/adapter.py) in a worker thread of this process, which
has the model's config, so neither the event loop nor the engine's step loop waits on the parse; the
engine then takes the adapter between two steps (a dict insert). Its buffer crosses the
pipe in shared memory (runtime/lora/shared_buffers.py). The same name loaded again with
the same bytes (a retry) is answered as loaded and changes nothing; with other bytes it
is refused, so a name means one adapter while it is loaded. The files' digest is taken
after the reply, as is the next load's buffer (`settle`): neither is on a load's path.
One lock orders the loads and unloads, which keeps the names here and the engine's the
same.

Refusals are `AdapterRefused`, with the status the route answers: 400 naming the field
(the spec's ValueError), 409 for a name taken by other bytes or by the base, or an
adapter a request still uses, 404 for a name not loaded, 500 when the engine is gone.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import mmap
from typing import TYPE_CHECKING, Awaitable, Callable, Optional, Union

from runtime.serve.engine_client import EngineClient
from runtime.serve.engine_core import AdapterBase
from runtime.serve.request_streams import EngineDead

if TYPE_CHECKING:
    from runtime.lora.adapter import LoraAdapter
    from runtime.lora.shared_buffers import SharedBuffers

Weights = Union[bytearray, mmap.mmap]         # a PUT's body, or its inbox file mapped (runtime/serve/adapter_inbox.py)


class AdapterRefused(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class ServedAdapters:
    def __init__(self, engine: EngineClient, base: AdapterBase, base_name: str):
        self.engine, self.base, self.base_name = engine, base, base_name
        self._digests: dict[str, asyncio.Future[str]] = {}   # name -> the digest of its files
        self._later: list[Callable[[], Awaitable[None]]] = []   # what loads left for after their replies
        self._lock = asyncio.Lock()
        self._buffers: Optional["SharedBuffers"] = None       # made on the first load (torch's)

    def __contains__(self, name: object) -> bool:
        return name in self._digests

    def names(self) -> tuple[str, ...]:
        return tuple(self._digests)

    async def put(self, name: str, config_json: bytes, weights: Weights) -> None:
        """Load an adapter under `name` (a name ADAPTER_NAME allows); AdapterRefused if not.
        Then `settle`, once the reply is sent."""
        if name == self.base_name:
            raise AdapterRefused(409, f"name: {name!r} is the base model's served name", param="name")
        async with self._lock:
            if name in self._digests:
                await self._check_same(name, config_json, weights)
                return
            try:
                adapter = await asyncio.to_thread(self._read, name, config_json, weights)
            except ValueError as exc:
                raise AdapterRefused(400, str(exc), param=_field(exc)) from None
            # once sent, the engine holds it: the name is recorded even if this caller leaves
            await asyncio.shield(self._install(adapter, config_json, weights))

    async def settle(self) -> None:
        """What loads left for after their replies: their files' digests, and the next
        load's buffer. Threads started before a reply would hold up its sending, taking the
        GIL from the event loop; the route runs this once its reply is sent, and a load
        under a name already loaded runs it first."""
        later, self._later = self._later, []
        for work in later:
            await work()

    async def _check_same(self, name: str, config_json: bytes, weights: Weights) -> None:
        await self.settle()
        if await asyncio.to_thread(digest, config_json, weights) != await self._digests[name]:
            raise AdapterRefused(409, f"name: an adapter {name!r} is loaded from other files; DELETE it "
                                      "first", param="name")

    async def _install(self, adapter: "LoraAdapter", config_json: bytes, weights: Weights) -> None:
        try:
            await self.engine.install_lora(adapter)
        except ValueError as exc:     # not one of ours: the engine's names and these agree
            raise AdapterRefused(409, str(exc)) from None
        except EngineDead as exc:
            raise AdapterRefused(500, f"engine: {exc}") from None
        digested: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._digests[adapter.name] = digested
        self._later.append(functools.partial(self._after, digested, config_json, weights, adapter.flat.numel()))

    async def _after(self, digested: "asyncio.Future[str]", config_json: bytes, weights: Weights,
                     elements: int) -> None:
        try:
            digested.set_result(await asyncio.to_thread(digest, config_json, weights))
        except Exception as exc:   # noqa: BLE001 - whoever compares files with it hears of it
            digested.set_exception(exc)
        assert self._buffers is not None
        await asyncio.to_thread(self._buffers.refill, elements)

    def _read(self, name: str, config_json: bytes, weights: Weights) -> "LoraAdapter":
        from runtime.lora.adapter import adapter_from_bytes   # torch: only a replica with adapter slots
        from runtime.lora.shared_buffers import SharedBuffers

        if self._buffers is None:
            self._buffers = SharedBuffers()
        return adapter_from_bytes(name, config_json, weights, self.base.model_config, self.base.max_lora_rank,
                                  shared=self._buffers)

    async def delete(self, name: str) -> None:
        """Unload an adapter no request uses; AdapterRefused 404 if not loaded, 409 in use."""
        async with self._lock:
            if name not in self._digests:
                raise AdapterRefused(404, f"name: no adapter {name!r} is loaded", param="name")
            try:
                await self.engine.remove_lora(name)
            except ValueError as exc:
                raise AdapterRefused(409, str(exc), param="name") from None
            except EngineDead as exc:
                raise AdapterRefused(500, f"engine: {exc}") from None
            del self._digests[name]


def digest(config_json: bytes, weights: Union[bytes, Weights]) -> str:
    """What tells one adapter's files from another's."""
    hashed = hashlib.sha256(config_json)
    hashed.update(b"\0")
    hashed.update(weights)
    return hashed.hexdigest()


def import_reader() -> None:
    """Import torch and the adapter reader (seconds): a replica with adapter slots does it
    while its engine loads, so the first PUT does not wait for it."""
    import runtime.lora.adapter  # noqa: F401


def _field(exc: ValueError) -> Optional[str]:
    head, sep, _ = str(exc).partition(":")
    return head if sep and " " not in head else None
