"""The Batch API with the official openai client against a real control plane, Postgres,
S3 and replica: files and batches created, listed, read and cancelled; the output and
error files one line per request in input order; a bad line in the error file; every
line billed once at the batch price (half the interactive one by default); another
tenant gets 404 for all of it."""
from __future__ import annotations

import io
import json
from decimal import Decimal

import openai
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.batch.results import invocation_id
from controlplane.store.tables import Batch, UsageEvent
from tests.controlplane.conftest import pooled_control_plane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(400)]
INPUT, OUTPUT = Decimal("1000"), Decimal("3000")      # per million tokens, interactive
CHAT = "/v1/chat/completions"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-batch")) as plane:
        yield plane


def chat_line(custom_id: str, model: str = "gen", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "max_tokens": 3, "temperature": 0,
                     "messages": [{"role": "user", "content": f"Say {custom_id}"}], **body}}


def jsonl(lines: list) -> bytes:
    return "".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines).encode()


async def _deploy(client, model_uri: str) -> None:
    """Each test's tenant has a deployment of its own; the plane has one CPU slot, so each
    replica gives it back soon after its test's last line."""
    created = await client.post("/v1/deployments", json={
        "name": "gen", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "scaling": {"idle_timeout_s": 2}, "engine": {"kv_cache_tokens": 512}})
    assert created.status_code == 201, created.text


async def _done(oa: openai.AsyncOpenAI, batch_id: str, *statuses: str):
    batch = await oa.batches.retrieve(batch_id)
    return batch if batch.status in statuses else None


async def _lines(oa: openai.AsyncOpenAI, file_id) -> list[dict]:
    assert file_id is not None
    return [json.loads(x) for x in (await oa.files.content(file_id)).text.splitlines()]


async def test_a_batch_runs_in_order_billed_once_at_the_batch_price(plane, model_uri):
    key, other = await plane.tenant_key("batcher"), await plane.tenant_key("stranger")
    await plane.set_price(tenant="batcher", input_per_mtok=str(INPUT), output_per_mtok=str(OUTPUT),
                          cached_input_per_mtok=str(INPUT))
    client = plane.client(key)
    await _deploy(client, model_uri)
    oa = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=60)
    theirs = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=other, max_retries=0)
    lines = [chat_line("c-0"), chat_line("c-1"), chat_line("nowhere", model="not-deployed"),
             chat_line("c-3"), "{not json", chat_line("too-many", max_tokens=-1), chat_line("c-6")]
    source = await oa.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert source.purpose == "batch" and source.bytes == len(jsonl(lines))
    assert (await oa.files.retrieve(source.id)).filename == "in.jsonl"
    assert source.id in [f.id for f in (await oa.files.list()).data]

    batch = await oa.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h",
                                    metadata={"job": "nightly"})
    assert batch.status == "in_progress" and batch.request_counts.total == 7
    assert batch.request_counts.failed == 3, "three lines were refused at create"
    done = await eventually(lambda: _done(oa, batch.id, "completed"), timeout_s=300,
                            what="the batch completed", every_s=0.5)
    assert done.request_counts.completed == 4 and done.request_counts.failed == 3
    assert done.metadata == {"job": "nightly"} and done.completed_at is not None

    output = await _lines(oa, done.output_file_id)
    assert [x["custom_id"] for x in output] == ["c-0", "c-1", "c-3", "c-6"], "in input order"
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in output)
    assert all(x["response"]["body"]["choices"][0]["message"]["content"] for x in output)
    assert output[0]["response"]["body"]["model"] == "gen"
    errors = await _lines(oa, done.error_file_id)
    assert [(x["custom_id"], x["error"]["code"]) for x in errors] == [
        ("nowhere", "deployment_not_found"), (None, "invalid_json_line"),
        ("too-many", "invalid_request")]
    assert "max_tokens" in errors[2]["error"]["message"]
    assert (await oa.files.retrieve(done.output_file_id)).purpose == "batch_output"

    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.request_id.like(f"{batch.id}-%"))))
    assert sorted(r.invocation_id for r in rows) == sorted(
        invocation_id(batch.id, n) for n in (0, 1, 3, 6)), "each line metered once, under its own id"
    for row in rows:
        assert row.status == "ok" and row.cost == \
            (row.prompt_tokens * INPUT + row.completion_tokens * OUTPUT) / 2 / 1_000_000

    listed = await oa.batches.list()
    assert batch.id in [b.id for b in listed.data]
    for call in (theirs.batches.retrieve(batch.id), theirs.batches.cancel(batch.id),
                 theirs.files.retrieve(source.id), theirs.files.content(done.output_file_id),
                 theirs.files.delete(source.id),
                 theirs.batches.create(input_file_id=source.id, endpoint=CHAT,
                                       completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            await call
    assert batch.id not in [b.id for b in (await theirs.batches.list()).data]
    assert (await theirs.files.list()).data == []

    with pytest.raises(openai.ConflictError):
        await oa.batches.cancel(batch.id)
    assert (await oa.files.delete(source.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await oa.files.retrieve(source.id)


async def test_a_file_that_is_not_jsonl_and_bad_fields_are_400(plane):
    key = await plane.tenant_key("careless")
    oa = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0)
    csv = await oa.files.create(file=("in.csv", io.BytesIO(b"a,b\n1,2\n")), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="JSONL"):
        await oa.batches.create(input_file_id=csv.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        await oa.batches.create(input_file_id=csv.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        await oa.batches.create(input_file_id=csv.id, endpoint="/v1/moderations",  # type: ignore[arg-type]
                                completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        await oa.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    big = plane.app.state.settings.batch_file_max_bytes
    with pytest.raises(openai.APIStatusError) as refused:
        await oa.files.create(file=("x.jsonl", io.BytesIO(b"x" * (big + 1))), purpose="batch")
    assert refused.value.status_code in (400, 413)


async def test_cancel_keeps_finished_lines_and_never_runs_the_rest(plane, model_uri):
    """...and a batch row of the price book prices its lines (over the discount)."""
    key = await plane.tenant_key("canceller")
    await plane.set_price(tenant="canceller", input_per_mtok="1000", output_per_mtok="3000")
    await plane.set_price(tenant="canceller", tier="batch", input_per_mtok="100",
                          output_per_mtok="200")
    client = plane.client(key)
    await _deploy(client, model_uri)
    oa = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=60)
    lines = [chat_line(f"l-{n}") for n in range(40)]
    source = await oa.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = await oa.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    cancelling = await oa.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    done = await eventually(lambda: _done(oa, batch.id, "cancelled"), timeout_s=300,
                            what="the batch cancelled", every_s=0.5)
    answered = await _lines(oa, done.output_file_id) if done.output_file_id else []
    unrun = await _lines(oa, done.error_file_id)
    assert {x["error"]["code"] for x in unrun} == {"batch_cancelled"}
    assert sorted([x["custom_id"] for x in answered + unrun], key=lambda c: int(c[2:])) == \
        [f"l-{n}" for n in range(40)], "every request once, in the output or the error file"
    assert done.request_counts.completed == len(answered) and done.request_counts.failed == 0
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        billed = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.request_id.like(f"{batch.id}-%"))))
    assert len(billed) == len(answered), "a line that never ran is never billed"
    for row in billed:
        assert row.cost == (row.prompt_tokens * 100 + row.completion_tokens * 200) / Decimal(1_000_000)


async def test_a_batch_past_its_window_expires_its_unrun_lines(plane, model_uri):
    """The window is moved into the past while the deployment's first replica is still
    cold: the lines not started go to the error file as batch_expired, any line already
    running keeps its answer, and the batch ends expired."""
    key = await plane.tenant_key("latecomer")
    client = plane.client(key)
    await _deploy(client, model_uri)
    oa = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=60)
    source = await oa.files.create(file=("in.jsonl", io.BytesIO(jsonl(
        [chat_line(f"l-{n}") for n in range(20)]))), purpose="batch")
    batch = await oa.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    async with plane.app.state.sessions.begin() as session:
        found = await session.get(Batch, batch.id)
        found.expires_at = found.created_at
    plane.app.state.batch_runner.wake()
    done = await eventually(lambda: _done(oa, batch.id, "expired"), timeout_s=300,
                            what="the batch expired", every_s=0.5)
    answered = await _lines(oa, done.output_file_id) if done.output_file_id else []
    expired = await _lines(oa, done.error_file_id)
    assert expired and {x["error"]["code"] for x in expired} == {"batch_expired"}
    assert sorted([x["custom_id"] for x in answered + expired], key=lambda c: int(c[2:])) == \
        [f"l-{n}" for n in range(20)]
    assert done.request_counts.failed == len(expired) and done.expired_at is not None
