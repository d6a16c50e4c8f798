"""Which model folders a warm standby is told it will likely load (pool/likely_models.py),
decided with no server; and the local backend telling a real standby (unconfined: a
sandboxed one is not told), which then holds the parsed tokenizer before its load
(tests/runtime_server/test_likely_models.py shows the load taking it)."""
from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from pool.likely_models import ModelLoad, likely_models, remember
from wire.replica_control import LIKELY_PATH


def loads(*pairs: tuple[str, str]) -> tuple[ModelLoad, ...]:
    return tuple(ModelLoad(r, f) for r, f in pairs)


def test_remember_keeps_one_load_per_revision_newest_first_and_a_bounded_few():
    seen: tuple[ModelLoad, ...] = ()
    for revision, folder in [("r1", "/m/a"), ("r2", "/m/b"), ("r1", "/m/a"), ("r3", "/m/c")]:
        seen = remember(seen, ModelLoad(revision, folder), keep=2)
    assert seen == loads(("r3", "/m/c"), ("r1", "/m/a"))


def test_predicted_revisions_first_then_the_most_recent_loads():
    seen = loads(("r4", "/m/d"), ("r3", "/m/c"), ("r2", "/m/b"), ("r1", "/m/a"))
    assert likely_models([], seen) == ("/m/d", "/m/c", "/m/b", "/m/a")
    assert likely_models(["r1", "r3"], seen) == ("/m/a", "/m/c", "/m/d", "/m/b")
    assert likely_models(["r1", "r3"], seen, limit=3) == ("/m/a", "/m/c", "/m/d")


def test_a_predicted_revision_never_loaded_here_has_no_folder_to_name():
    assert likely_models(["r9"], ()) == ()
    assert likely_models(["r9", "r1"], loads(("r2", "/m/b"), ("r1", "/m/a"))) == ("/m/a", "/m/b")


def test_revisions_of_one_folder_name_it_once():
    seen = loads(("r2", "/m/a"), ("r1", "/m/a"), ("r0", "/m/z"))
    assert likely_models(["r1"], seen) == ("/m/a", "/m/z")


# ---------------------------------------------------------------- the pool telling a standby

@pytest.mark.timeout(240)
@pytest.mark.asyncio(loop_scope="session")
async def test_a_refilled_standby_is_told_the_model_just_loaded_and_parses_it(
        s3_server, pool_bucket, tiny_model, tmp_path):
    from contextlib import AsyncExitStack

    from pool.backends.local import LocalBackend
    from pool.in_memory import EventLog, InMemoryDesiredState
    from pool.manager import PoolManager
    from pool.s3 import open_client
    from tests.pool.conftest import make_settings
    from tests.support.clock import SteppedClock
    from tests.support.model_factory import upload_model
    from tests.support.pool_calls import complete, spec_for
    from tests.support.waiting import eventually

    settings = make_settings(s3_server, tmp_path, cpu_slots=1, slot_memory_gb=1, warm_pool_size=1,
                             tick_s=0.2, runtime_threads=1, kv_cache_tokens_default=512,
                             load_timeout_s=120, pull_timeout_s=60, standby_refill_delay_s=0.1,
                             sandbox="off")     # a sandboxed standby is never told: see local.py
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/tiny")
    desired = InMemoryDesiredState()
    async with AsyncExitStack() as stack:
        manager = PoolManager(settings, desired, EventLog(), s3_client=await open_client(settings, stack),
                              clock=SteppedClock())
        await manager.start()
        try:
            backend = manager.backend
            assert isinstance(backend, LocalBackend)
            spec = spec_for(uri)
            desired.put(spec)
            async with await manager.acquire(spec, request_id="r1", prefix_key=None, prompt_tokens=4,
                                             timeout_s=120) as lease:
                assert (await complete(lease))["usage"]["completion_tokens"] == 8
            (folder,) = backend.likely_models()
            assert Path(folder).is_relative_to(settings.cache_dir) and (Path(folder) / "tokenizer.json").is_file()
            # the refill's standby comes up and is told; it parses the tokenizer meanwhile
            await eventually(lambda: any(w.told == (folder,) for w in backend.waiting()), timeout_s=180,
                             what="a standby told the model just loaded")
            (warm,) = backend.waiting()
            async with httpx.AsyncClient(base_url=warm.base_url, headers={"Authorization": f"Bearer {warm.secret}"},
                                         timeout=10) as c:
                async def parsed() -> bool:
                    return folder in (await c.get(LIKELY_PATH)).json()["models"]
                await eventually(parsed, timeout_s=60, what="the tokenizer parsed ahead")
            # a prediction of the same revision names the same folder first
            backend.expect([spec.revision_id, "rev-never-loaded"])
            assert backend.likely_models() == (folder,)
        finally:
            await manager.stop()
