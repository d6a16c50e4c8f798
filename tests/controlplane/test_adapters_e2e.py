"""Issue 33 end to end: two tenants' LoRA adapters on one shared catalogue base, through
the control plane, the real pool and a real replica, with the official openai client.

Each adapter's greedy output equals the offline engine's with the same adapter (and
differs from the base's: the adapter is applied), whether named `base:adapter` or by its
own name; each tenant sees, lists and runs only its own adapters (404 both ways); the
first call of an adapter waits only for the adapter's load into the warm replica (no
second replica, a timed `adapter_load` stage), later calls for nothing; and every call's
usage row names its adapter and is priced by the adapter's row, else the base's."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import openai
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import ReplicaLifetime, UsageEvent
from tests.controlplane.conftest import MODELS_BUCKET, pooled_control_plane
from tests.support.peft_adapters import make_adapter
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(400)]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [5, 17, 42, 8, 99, 3, 250, 11]
BASE_PRICE, ADAPTER_PRICE, OUTPUT = Decimal("1000"), Decimal("5000"), Decimal("2000")   # per Mtok


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-lora"),
                                    cpu_slots=1) as plane:
        yield plane


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("peft-e2e")
    return {"support": make_adapter(tiny_model, tmp / "support", 4, TARGETS, seed=11),
            "legal": make_adapter(tiny_model, tmp / "legal", 8, ["q_proj", "v_proj", "down_proj"], seed=12)}


@pytest.fixture(scope="module")
def offline(tiny_model, adapters) -> dict[str, str]:
    """Each adapter's (and the base's) greedy text from the offline engine."""
    from runtime import LLM
    from wire.sampling import SamplingParams

    llm = LLM(str(tiny_model), kv_cache_tokens=512, max_loras=2, max_lora_rank=8)
    for name, folder in adapters.items():
        llm.engine.add_lora(name, str(folder))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    names = [None, *adapters]
    outs = llm.generate([PROMPT] * len(names), params, lora=names)
    return {name or "base": out.text for name, out in zip(names, outs)}


async def _attach(plane, key: str, tenant: str, name: str, folder: Path, s3_server) -> None:
    upload_model(folder, s3_server.client(), MODELS_BUCKET, f"{tenant}/{name}")
    made = await plane.client(key).post("/v1/adapters", json={
        "name": name, "base": "llama", "adapter_uri": f"s3://{MODELS_BUCKET}/{tenant}/{name}/"})
    assert made.status_code == 201, made.text


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(plane, s3_server, tiny_model, adapters):
    """The operator's tenant `catalog` shares its base `llama` (two adapter slots);
    tenant `ta` attaches `support` to it and `tb` attaches `legal`."""
    keys = {t: await plane.tenant_key(t) for t in ("catalog", "ta", "tb")}
    upload_model(tiny_model, s3_server.client(), MODELS_BUCKET, "catalog/llama")
    made = await plane.client(keys["catalog"]).post("/v1/deployments", json={
        "name": "llama", "model_uri": f"s3://{MODELS_BUCKET}/catalog/llama/",
        "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 512, "max_loras": 2, "max_lora_rank": 8}})
    assert made.status_code == 201, made.text
    shared = await plane.admin.patch("/v1/tenants/catalog/deployments/llama", json={"shared": True})
    assert shared.status_code == 200, shared.text
    await _attach(plane, keys["ta"], "ta", "support", adapters["support"], s3_server)
    await _attach(plane, keys["tb"], "tb", "legal", adapters["legal"], s3_server)
    await plane.set_price(tenant="catalog", deployment="llama", input_per_mtok=str(BASE_PRICE),
                          cached_input_per_mtok=str(BASE_PRICE), output_per_mtok=str(OUTPUT))
    await plane.set_price(tenant="ta", adapter="support", input_per_mtok=str(ADAPTER_PRICE),
                          cached_input_per_mtok=str(ADAPTER_PRICE), output_per_mtok=str(OUTPUT))
    return keys


def _client(plane, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=280)


async def _complete(oa: openai.AsyncOpenAI, model: str, request_id: str):
    raw = await oa.completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": request_id})
    return raw.headers, raw.parse()


async def _rows(plane, *request_ids: str) -> dict[str, UsageEvent]:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = await session.scalars(select(UsageEvent).where(UsageEvent.request_id.in_(request_ids)))
        return {row.request_id: row for row in rows}


async def test_two_tenants_adapters_on_one_shared_base(plane, world, offline):
    ta, tb = _client(plane, world["ta"]), _client(plane, world["tb"])
    try:
        assert sorted(m.id for m in (await ta.models.list()).data) == ["llama", "llama:support"]
        assert sorted(m.id for m in (await tb.models.list()).data) == ["llama", "llama:legal"]

        headers, first = await _complete(ta, "llama:support", "lora-a1")
        assert first.choices[0].text == offline["support"] != offline["base"]
        assert first.model == "llama:support"
        assert float(headers["x-thawpool-adapter-load-s"]) > 0, "the first call waits for the load"
        headers, again = await _complete(ta, "support", "lora-a2")       # the adapter's own name
        assert again.choices[0].text == offline["support"]
        assert "x-thawpool-adapter-load-s" not in headers, "held by the replica now"
        _, legal = await _complete(tb, "llama:legal", "lora-b1")
        assert legal.choices[0].text == offline["legal"] != offline["support"]
        _, base = await _complete(tb, "llama", "lora-b2")
        assert base.choices[0].text == offline["base"]

        stream = await ta.chat.completions.create(
            model="llama:support", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": "lora-a3"})
        chunks = [chunk async for chunk in stream]
        assert {c.model for c in chunks} == {"llama:support"} and chunks[-1].usage.completion_tokens == 4

        for client, model in ((tb, "llama:support"), (tb, "support"), (ta, "llama:legal"), (ta, "legal")):
            with pytest.raises(openai.NotFoundError):
                await client.completions.create(model=model, prompt=PROMPT, max_tokens=2)
    finally:
        await ta.close()
        await tb.close()

    rows = await _rows(plane, "lora-a1", "lora-a2", "lora-a3", "lora-b1", "lora-b2")
    assert [rows[r].adapter_name for r in ("lora-a1", "lora-a2", "lora-a3", "lora-b1", "lora-b2")] == \
        ["support", "support", "support", "legal", None]
    assert len({rows[r].tenant_id for r in ("lora-a1", "lora-a2", "lora-a3")}) == 1
    assert rows["lora-a1"].tenant_id != rows["lora-b1"].tenant_id == rows["lora-b2"].tenant_id
    assert rows["lora-a1"].adapter_load_s > 0 and rows["lora-b1"].adapter_load_s > 0
    assert rows["lora-a2"].adapter_load_s is None and rows["lora-b2"].adapter_load_s is None
    for request_id, row in rows.items():
        price = ADAPTER_PRICE if row.adapter_name == "support" else BASE_PRICE
        assert row.cost == (row.prompt_tokens * price + row.completion_tokens * OUTPUT) / 1_000_000, request_id
        assert row.status == "ok" and row.completion_tokens == (4 if request_id == "lora-a3" else 8)
    text = generate_latest(plane.app.state.metrics.tenant_registry).decode()
    loads = {(s.name, s.labels.get("tenant")): s.value for family in text_string_to_metric_families(text)
             for s in family.samples if s.name.startswith("thawpool_adapter_load_seconds")}
    assert loads[("thawpool_adapter_load_seconds_count", "ta")] == 1, "the first call's wait only"
    assert loads[("thawpool_adapter_load_seconds_sum", "ta")] == pytest.approx(rows["lora-a1"].adapter_load_s)
    async with plane.app.state.sessions() as session:
        lifetimes = (await session.scalars(select(ReplicaLifetime))).all()
    assert len({r.replica_id for r in rows.values()}) == 1 and len(lifetimes) == 1, \
        "adapters on a warm base start no replica"


async def test_a_base_changed_to_no_slots_refuses_its_adapters_before_any_replica(plane, world):
    catalog = plane.client(world["catalog"])
    changed = await catalog.patch("/v1/deployments/llama", json={"engine": {"max_loras": None}})
    assert changed.status_code == 200, changed.text
    ta = _client(plane, world["ta"])
    try:
        with pytest.raises(openai.ConflictError) as refused:
            await ta.completions.create(model="llama:support", prompt=PROMPT, max_tokens=2,
                                        extra_headers={"x-request-id": "lora-noslots"})
        assert refused.value.body["code"] == "no_adapter_slots"
    finally:
        await ta.close()
    assert await _rows(plane, "lora-noslots") == {}
