"""`python -m runtime.functions.server` as a real process: batching, failures, secret, limits."""
import asyncio

import httpx
import pytest

from tests.functions.conftest import FunctionProcess

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def probe_server(probe_package, tmp_path_factory):
    server = FunctionProcess(probe_package(max_batch_size=4), tmp_path_factory.mktemp("fs") / "probe.log",
                             "--memory-limit-mb", "3072", "--max-open-files", "256")
    try:
        server.wait()
        yield server
    finally:
        server.stop()


async def _invoke_all(server, bodies):
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=60) as c:
        return await asyncio.gather(*(c.post("/invoke", json=b) for b in bodies))


async def test_four_concurrent_calls_are_one_predict_each_gets_its_own_answer(probe_server):
    answers = await _invoke_all(probe_server, [{"input": {"echo": i}} for i in range(4)])
    assert [a.status_code for a in answers] == [200] * 4
    outputs = [a.json()["output"] for a in answers]
    assert [o["echo"] for o in outputs] == [0, 1, 2, 3]
    assert {o["batch"] for o in outputs} == {4} and {o["weights"] for o in outputs} == {"probe-weights-v1"}
    assert all(a.json()["usage"]["items"] == 1 and a.json()["usage"]["compute_s"] > 0 for a in answers)


async def test_a_handler_error_fails_only_its_batch_with_a_clear_error(probe_server):
    failed = await _invoke_all(probe_server, [{"input": {"echo": 1}}, {"input": {"fail": "bad input 7"}},
                                              {"inputs": [{"echo": 2}, {"echo": 3}]}])
    assert [a.status_code for a in failed] == [500] * 3
    error = failed[1].json()["error"]
    assert error["code"] == "function_error" and "ValueError: bad input 7 (probe.py:" in error["message"]
    short = await _invoke_all(probe_server, [{"inputs": [{"short": True}, {}, {}, {}]}])
    assert "returned 3 results for 4 inputs" in short[0].json()["error"]["message"]
    after = await _invoke_all(probe_server, [{"inputs": [{"echo": i} for i in range(4)]}])
    assert after[0].status_code == 200 and len(after[0].json()["outputs"]) == 4


async def test_bad_input_is_400_and_never_reaches_the_handler(probe_server):
    async with httpx.AsyncClient(base_url=probe_server.base_url, headers=probe_server.headers) as c:
        before = (await c.get("/stats")).json()
        bad_json = await c.post("/invoke", content=b"{not json")
        bad_item = await c.post("/invoke", json={"inputs": [{"echo": 1}, "two", {}, {}]})
        deep = await c.post("/invoke", content=b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        after = (await c.get("/stats")).json()
    assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] == "body"
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "too_deep"
    assert bad_item.status_code == 400 and bad_item.json()["error"]["param"] == "inputs[1]"
    assert (after["requests"], after["items"]) == (before["requests"], before["items"])


async def test_only_health_is_open_without_the_secret(probe_server):
    async with httpx.AsyncClient(base_url=probe_server.base_url) as c:
        health = await c.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ready"})   # nothing more
        told = (await c.get("/health", headers=probe_server.headers)).json()
        assert told["status"] == "ready" and told["load_timings"]["load_s"] > 0       # the pool's
        refused = await c.post("/invoke", json={"input": {}})
        models = await c.get("/v1/models", headers=probe_server.headers)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert models.json()["data"] == [{"id": "probe", "object": "model"}]


async def test_memory_past_the_limit_fails_the_batch_and_the_process_keeps_serving(probe_server):
    over = await _invoke_all(probe_server, [{"inputs": [{"alloc_mb": 8192}, {}, {}, {}]}])
    assert over[0].status_code == 500 and "MemoryError" in over[0].json()["error"]["message"]
    again = await _invoke_all(probe_server, [{"inputs": [{"echo": 1}] * 4}])
    assert again[0].status_code == 200


async def test_the_secret_is_gone_from_the_handlers_environment(probe_server):
    answer = await _invoke_all(probe_server, [{"inputs": [{"env": True}] * 4}])
    names = answer[0].json()["outputs"][0]["env"]
    assert "THAWPOOL_REPLICA_SECRET" not in names


async def test_a_handler_that_cannot_load_is_failed_with_its_reason(probe_package, tmp_path):
    package = probe_package()
    (package / "weights.txt").unlink()
    server = FunctionProcess(package, tmp_path / "broken.log")
    try:
        health = server.wait("failed")
        stranger = httpx.get(f"{server.base_url}/health", timeout=10)
    finally:
        server.stop()
    assert "FileNotFoundError" in health["error"] and "weights.txt" in health["error"]
    assert (stranger.status_code, stranger.json()) == (500, {"status": "failed"})

