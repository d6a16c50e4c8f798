"""Weight download into the content cache, against real S3 (SeaweedFS)."""
import hashlib
import os
import stat
from pathlib import Path

import pytest

from pool.api import ColdStartFailed
from pool.weights.inspection import inspect_model
from pool.s3 import list_objects
from pool.weights.cache import WeightCache, entry_key
from pool.weights.download import part_ranges
from pool.weights.store import WeightStore
from tests.pool.conftest import FlakyS3
from tests.support.model_factory import upload_model

pytestmark = pytest.mark.asyncio(loop_scope="session")


def store_for(client, settings, **changes):
    settings = settings.with_(**changes)
    return WeightStore(client, WeightCache(settings.cache_dir, settings.cache_budget_bytes), settings)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_part_ranges_cover_the_object_exactly():
    assert part_ranges(10, 4) == [(0, 3), (4, 7), (8, 9)]
    assert part_ranges(8, 4) == [(0, 3), (4, 7)]
    assert part_ranges(0, 4) == []


async def test_parallel_ranged_download_is_byte_exact(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(s3, settings, part_size_mb=16 / 1024, download_concurrency=4)   # 16 KiB parts
    files = await store.fetch_model(uri)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert digest(files.model_dir / name) == digest(tiny_model / name)
    assert files.downloaded_bytes == sum(f.stat().st_size for f in tiny_model.iterdir() if f.is_file())
    assert files.cached_bytes == 0
    assert os.listdir(store.cache.tmp) == []


async def test_second_fetch_is_a_cache_hit_with_no_get(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    await store_for(s3, settings).fetch_model(uri)
    counting = FlakyS3(s3)
    again = await store_for(counting, settings).fetch_model(uri)     # a new store over the same dir
    assert counting.calls == 0 and again.downloaded_bytes == 0
    assert again.cached_bytes == sum(f.stat().st_size for f in tiny_model.iterdir() if f.is_file())
    assert digest(again.model_dir / "model.safetensors") == digest(tiny_model / "model.safetensors")


async def test_throttling_is_retried(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    flaky = FlakyS3(s3, throttle=3)
    files = await store_for(flaky, settings, download_concurrency=1).fetch_model(uri)
    assert digest(files.model_dir / "model.safetensors") == digest(tiny_model / "model.safetensors")
    # one GET per file (each is under the 8 MiB part size), plus the 3 that were throttled
    files_in_model = sum(1 for f in tiny_model.iterdir() if f.is_file())
    assert flaky.calls == 3 + files_in_model


async def test_throttling_beyond_attempts_fails_clearly(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(FlakyS3(s3, throttle=1000), settings, s3_attempts=3)
    with pytest.raises(Exception, match="SlowDown"):
        await store.fetch_model(uri)
    assert os.listdir(store.cache.tmp) == [] and store.cache.used_bytes == 0


async def test_partial_download_never_enters_the_cache(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(FlakyS3(s3, deny_call=5), settings, part_size_mb=16 / 1024, download_concurrency=2)
    with pytest.raises(Exception, match="AccessDenied"):
        await store.fetch_model(uri)
    objects = await store.list_model(uri)
    weights = next(o for o in objects if o.key.endswith("model.safetensors"))
    assert weights not in store.cache
    assert os.listdir(store.cache.tmp) == []
    assert not (store.cache.objects / entry_key(weights)).exists()


async def test_missing_object_fails_with_reason(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(s3, settings)
    objects = await store.list_model(uri)
    s3_server.client().delete_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/tiny/model.safetensors")
    with pytest.raises(ColdStartFailed, match=r"missing object s3://.*/tiny/model.safetensors"):
        await store.fetch_model(uri, objects)
    with pytest.raises(ColdStartFailed, match="model.safetensors"):
        await store.fetch_model(uri)


async def test_object_changed_since_listing_is_a_mismatch(s3, s3_server, pool_bucket, fresh_prefix, settings,
                                                          tiny_model, tmp_path):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(s3, settings)
    stale = await store.list_model(uri)
    other = tmp_path / "other.json"
    other.write_text('{"architectures": ["MistralForCausalLM"]}')
    s3_server.client().upload_file(str(other), pool_bucket, f"{fresh_prefix}/tiny/config.json")
    with pytest.raises(ColdStartFailed, match="mismatch.*config.json"):
        await store.fetch_model(uri, stale)
    assert os.listdir(store.cache.tmp) == []


async def test_lru_eviction_under_budget_spares_pinned(s3, s3_server, pool_bucket, fresh_prefix, settings, tmp_path):
    client = s3_server.client()
    blobs = {}
    for name in ("a", "b", "c"):
        blobs[name] = os.urandom(40_000)
        client.put_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/{name}", Body=blobs[name])
    store = store_for(s3, settings, cache_disk_budget_gb=100_000 / 1024 ** 3)
    objs = {o.key[-1]: o for o in await list_objects(s3, pool_bucket, f"{fresh_prefix}/")}
    path_a = await store.fetch_object(objs["a"])
    store.cache.pin(["pinned-a"])
    await store.fetch_object(objs["b"])
    await store.cache.lookup(objs["a"])                # a is now the most recently used
    await store.fetch_object(objs["c"])                # over budget: evicts b, the oldest
    assert objs["a"] in store.cache and objs["c"] in store.cache and objs["b"] not in store.cache
    assert path_a.read_bytes() == blobs["a"]
    store.cache.pin([entry_key(objs["c"])])
    await store.fetch_object(objs["b"])                # a is evicted; c is pinned
    assert objs["c"] in store.cache and objs["b"] in store.cache and objs["a"] not in store.cache
    assert store.cache.used_bytes == 80_000


async def test_a_new_cache_folder_is_its_owners_alone(tmp_path):
    root = tmp_path / "fresh" / "cache"
    WeightCache(root, 1024)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def overwrite_keeping_mtime(path, data: bytes) -> None:
    """What a process with write access to the cache could do: other bytes, same size, the
    old mtime put back."""
    before = path.stat()
    os.chmod(path, 0o644)
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("restart", [False, True], ids=["same-store", "after-restart"])
async def test_a_cache_entry_overwritten_with_same_size_bytes_is_fetched_again(
        s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model, restart):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(s3, settings)
    first = await store.fetch_model(uri)
    cached = (first.model_dir / "model.safetensors").resolve()
    size = cached.stat().st_size
    overwrite_keeping_mtime(cached, os.urandom(size))
    store.release(first)
    again = await (store_for(s3, settings) if restart else store).fetch_model(uri)
    assert digest(again.model_dir / "model.safetensors") == digest(tiny_model / "model.safetensors")
    assert again.downloaded_bytes == size


async def test_an_untouched_entry_is_not_hashed_again_on_a_hit(s3, s3_server, pool_bucket, fresh_prefix, settings,
                                                             tiny_model, monkeypatch):
    from pool.weights import cache

    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    store = store_for(s3, settings)
    await store.fetch_model(uri)
    hashed = []
    monkeypatch.setattr(cache, "sha256_of", lambda path: hashed.append(path) or "")
    again = await store.fetch_model(uri)
    assert hashed == [] and again.downloaded_bytes == 0


async def test_a_pinned_object_swapped_under_its_key_is_refused(s3, s3_server, pool_bucket, fresh_prefix, settings,
                                                               tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    deployed = (await inspect_model(s3, uri)).objects
    key = f"{fresh_prefix}/tiny/model.safetensors"
    size = (tiny_model / "model.safetensors").stat().st_size
    for swapped in (os.urandom(size), os.urandom(3 * size)):       # the same size, and a bigger model
        s3_server.client().put_object(Bucket=pool_bucket, Key=key, Body=swapped)
        store = store_for(s3, settings)
        with pytest.raises(ColdStartFailed, match=rf"s3://{pool_bucket}/{key} changed since its revision "
                                                  rf"was deployed \(ETag \w+, {len(swapped)} bytes; deployed: "
                                                  rf"ETag \w+, {size} bytes\)"):
            await store.fetch_model(uri, pins=deployed)
        with pytest.raises(ColdStartFailed, match="changed since its revision was deployed"):
            await store.cache_model(uri, pins=deployed)
        assert store.cache.used_bytes == 0


async def test_objects_added_after_deploy_are_not_the_revisions(s3, s3_server, pool_bucket, fresh_prefix, settings,
                                                               tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    deployed = (await inspect_model(s3, uri)).objects
    s3_server.client().put_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/tiny/extra.safetensors", Body=b"x" * 99)
    files = await store_for(s3, settings).fetch_model(uri, pins=deployed)
    assert sorted(p.name for p in files.model_dir.iterdir()) == sorted(p.name for p in tiny_model.iterdir())
    s3_server.client().delete_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/tiny/tokenizer.json")
    with pytest.raises(ColdStartFailed, match=r"missing object s3://.*/tiny/tokenizer.json: its revision was "
                                              r"deployed with it"):
        await store_for(s3, settings).fetch_model(uri, pins=deployed)


async def test_a_node_pull_holds_to_the_revisions_pins(s3, s3_server, pool_bucket, fresh_prefix, settings, tiny_model):
    """A backend that pulls on its node (Ray's ReplicaActor.model_folder) refuses swapped bytes too."""
    from pool.backends.ray_actor import pull_model

    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    deployed = (await inspect_model(s3, uri)).objects
    assert (Path(await pull_model(uri, settings, deployed)) / "model.safetensors").is_file()
    size = (tiny_model / "model.safetensors").stat().st_size
    s3_server.client().put_object(Bucket=pool_bucket, Key=f"{fresh_prefix}/tiny/model.safetensors",
                                  Body=os.urandom(size))
    with pytest.raises(ColdStartFailed, match="model.safetensors changed since its revision was deployed"):
        await pull_model(uri, settings, deployed)
