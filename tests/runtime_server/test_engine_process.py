"""The engine's step loop in an engine-core process of its own (runtime/serve/engine_core.py),
the server talking to it over a pipe (runtime/serve/engine_client.py): the one way a
replica runs its engine.

A client that leaves frees its request in the core; a core that is killed fails its
requests cleanly (an error event, never a hang), /health reports failed and the replica
exits; a core never outlives its server, stopped or killed; a standby's core is started
(and imports torch) before the load names a model. (The answers equal the offline
engine's: test_server_openai.py; the loop without a process: test_engine_client.py.)
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from runtime.serve.model_host import EXIT_WORKER_DIED
from tests.runtime_server.conftest import SERVED_NAME, ServerProcess, start_server
from tests.runtime_server.metrics_text import scrape
from tests.runtime_server.test_cancellation import ABORTS, LONG, assert_aborted_once, wait_idle
from tests.support.waiting import eventually_sync

EXIT_TIMEOUT_S = 30


@pytest.fixture
def doomed_server(tiny_model, engine_kwargs, tmp_path):
    """A replica of its own, for a test that kills part of it."""
    proc = start_server(["--model", str(tiny_model), "--served-model-name", SERVED_NAME,
                         "--kv-cache-tokens", str(engine_kwargs["kv_cache_tokens"]),
                         "--block-size", str(engine_kwargs["block_size"])],
                        tmp_path / "server.log")
    try:
        proc.wait_health({"ready"})
        yield proc
    finally:
        proc.stop()


def core_pid(server: ServerProcess) -> int:
    pid = httpx.get(f"{server.base_url}/health", timeout=10).json()["engine_core"]["pid"]
    assert pid != server.process.pid
    return int(pid)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, reaped by nobody but its dead parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def completion(base_url: str, body: dict) -> dict:
    resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_shared_server_runs_its_engine_in_a_core_process(server):
    assert core_pid(server) != server.process.pid


def test_a_client_that_leaves_frees_its_request_in_the_core(server):
    pid = core_pid(server)
    body = {**LONG, "max_tokens": 1000, "stream": True}   # about 1 s of the core's time
    for _ in range(3):   # a machine too busy to freeze the core mid-request tries again
        before = wait_idle(server.base_url)
        if leave_mid_stream(server, pid, body, before):
            break
    else:
        pytest.fail("the request always finished before the core could be frozen")
    after = wait_idle(server.base_url)
    assert_aborted_once(before, after, body["max_tokens"])


def leave_mid_stream(server: ServerProcess, pid: int, body: dict, before: dict) -> bool:
    """Stream, freeze the core, leave; False if the request had finished meanwhile.

    Frozen, the core cannot finish the request (it makes a token in about a millisecond)
    while the client goes; the server, not frozen, sees the client leave and counts the
    abort as it sends it on."""
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as resp:
            assert next(resp.iter_lines()).startswith("data: ")
            os.kill(pid, signal.SIGSTOP)
            try:
                if scrape(server.base_url)["thawpool_num_requests_running"] != 1:
                    return False
                resp.close()
                eventually_sync(lambda: scrape(server.base_url).get(ABORTS, 0)
                                > before.get(ABORTS, 0), timeout_s=30,
                                what="the server aborting the request")
            finally:
                os.kill(pid, signal.SIGCONT)
    return True


def test_a_killed_core_fails_its_requests_and_the_replica(doomed_server):
    pid = core_pid(doomed_server)
    events: list[str] = []
    with httpx.Client(base_url=doomed_server.base_url, timeout=30) as c:
        body = {**LONG, "max_tokens": 900, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as resp:
            lines = (line for line in resp.iter_lines() if line)
            events.append(next(lines))
            os.kill(pid, signal.SIGKILL)
            events += list(lines)        # bounded by the client's timeout: never a hang
        assert events[-1] != "data: [DONE]" and "data: [DONE]" not in events
        assert "engine core process exited with code -9" in events[-1]
        health = _health_or_none(c)
    # /health says failed until the replica exits (a moment later), unless it already did
    if health is not None:
        assert health.status_code == 500 and health.json()["status"] == "failed", health.text
    assert doomed_server.process.wait(timeout=EXIT_TIMEOUT_S) == EXIT_WORKER_DIED
    assert not _alive(pid)


def test_a_core_dies_with_its_server(doomed_server):
    pid = core_pid(doomed_server)
    doomed_server.process.kill()
    doomed_server.process.wait(timeout=EXIT_TIMEOUT_S)
    eventually_sync(lambda: not _alive(pid), timeout_s=EXIT_TIMEOUT_S,
                    what="the engine core exiting with its killed server")


def _health_or_none(client: httpx.Client) -> httpx.Response | None:
    try:
        return client.get("/health", timeout=5)
    except httpx.HTTPError:
        return None


def test_a_standby_warms_its_core_and_loads_into_it(tiny_model, engine_kwargs, tmp_path):
    proc = start_server(["--standby"], tmp_path / "server.log")
    pid = None
    try:
        proc.wait_health({"standby"})
        # torch is imported where the engine will run, not in the server process
        assert "libtorch" not in Path(f"/proc/{proc.process.pid}/maps").read_text()
        load = {"model": str(tiny_model), "served_model_name": SERVED_NAME, "engine": engine_kwargs}
        assert httpx.post(f"{proc.base_url}/admin/load", json=load, timeout=10).status_code == 202
        ready = proc.wait_health({"ready"})
        assert ready["load_timings"]["process_s"] == 0.0, "the core had torch before the load"
        pid = core_pid(proc)
        done = completion(proc.base_url, {"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
        assert done["usage"]["completion_tokens"] == 3
    finally:
        proc.stop()
    # a clean stop ends the core too
    eventually_sync(lambda: not _alive(pid), timeout_s=EXIT_TIMEOUT_S,
                    what="the engine core exiting with its server")

