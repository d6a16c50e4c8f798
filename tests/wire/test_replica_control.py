"""The replica's control messages (wire/replica_control.py): what the runtime sends
parses back to the same message, the bodies of replicas already running (adopted
across a pool restart) still parse, and every number or string a hostile replica
sends is kept only within its bound."""
from __future__ import annotations

import json
import math

import pytest

from wire.errors import ProtocolError
from wire.replica_control import (ADAPTER_FILE_HEADER, MAX_ADAPTER_FILE, MAX_COUNTER, MAX_PIDS, MAX_STAGE_NAME,
                                  MAX_STAGE_S, MAX_STAGES, MAX_TEXT, BadReply, FreedBytes, Health, HealthStatus,
                                  LoadReply, LoadRequest, SleepReply, Stats, WakeReply, adapter_file, counter,
                                  stages)
from wire.replica_control import AdapterList, AdapterReply


def over_the_wire(body: dict) -> object:
    """What the other side reads: the JSON text, parsed again."""
    return json.loads(json.dumps(body))


@pytest.mark.parametrize("message", [
    Health(HealthStatus.READY, "rev", {"weights_s": 0.25, "total_s": 1.0}, None, (41, 42), 40),
    Health(HealthStatus.FAILED, "rev", {"total_s": 0.5}, "OSError: no such file"),
    Health(HealthStatus.STANDBY),
    Stats("rev", 3, 120, 48),
    Stats("fn", 2, 0, 0, items=5, batches=2, compute_s=0.125),
    SleepReply(600, 0.25, FreedBytes(1000, 24)),
    WakeReply({"weights_s": 0.1, "kv_cache_s": 0.02, "total_s": 0.15}),
    LoadReply(HealthStatus.LOADING, "rev"),
])
def test_what_the_runtime_sends_parses_back_to_the_same_message(message):
    assert type(message).parse(over_the_wire(message.to_json())) == message


def test_a_load_request_parses_back_with_its_engine_options():
    request = LoadRequest("/models/m", "rev", {"kv_cache_tokens": 256, "dtype": "float32"})
    assert LoadRequest.parse(over_the_wire(request.to_json()), {"kv_cache_tokens", "dtype"}) == request
    assert LoadRequest.parse({"model": "/m"}, ()) == LoadRequest("/m", "/m", {})


def test_the_shapes_replicas_already_send_still_parse():
    """Bodies as the runtime's servers wrote them before the messages had a home."""
    ready = Health.parse({"status": "ready", "model": "rev", "load_timings": {"total_s": 1.5},
                          "tensor_parallel": {"size": 2, "worker_pids": [7]}, "engine_core": {"pid": 6}})
    assert (ready.http_status, ready.worker_pids, ready.core_pid) == (200, (7,), 6)
    failed = Health.parse({"status": "failed", "model": "rev", "load_timings": {"total_s": 0.1},
                           "error": None})
    assert (failed.http_status, failed.error) == (500, None)
    function = Health.parse({"status": "ready", "load_timings": {"load_s": 0.01}})
    assert function.load_timings == {"load_s": 0.01}
    stats = Stats.parse({"model": "fn", "prompt_tokens": 0, "completion_tokens": 0, "requests": 1,
                         "items": 1, "batches": 1, "compute_s": 0.0})
    assert (stats.requests, stats.items) == (1, 1)
    asleep = SleepReply.parse({"status": "sleeping", "sleep_s": 0.5,
                               "freed_bytes": {"weights": 10, "kv_cache": 2, "total": 12}, "host_bytes": 10})
    assert asleep == SleepReply(10, 0.5, FreedBytes(10, 2))


def test_the_model_servers_bodies_keep_their_shape():
    assert Health(HealthStatus.READY, "rev", {"total_s": 1.0}, None, (7,), 6).to_json() == {
        "status": "ready", "model": "rev", "load_timings": {"total_s": 1.0},
        "tensor_parallel": {"size": 2, "worker_pids": [7]}, "engine_core": {"pid": 6}}
    assert Health(HealthStatus.FAILED, error="boom").public().to_json() == {"status": "failed"}
    assert SleepReply(10, 0.1234567, FreedBytes(10, 2)).to_json() == {
        "status": "sleeping", "sleep_s": 0.123457,
        "freed_bytes": {"weights": 10, "kv_cache": 2, "total": 12}, "host_bytes": 10}
    assert Stats("rev", 1, 2, 3).to_json() == {"model": "rev", "requests": 1, "prompt_tokens": 2,
                                               "completion_tokens": 3}
    assert WakeReply({"total_s": 0.5}).to_json() == {"status": "ready", "wake_timings": {"total_s": 0.5}}


@pytest.mark.parametrize("status, http_status", [
    (HealthStatus.READY, 200), (HealthStatus.FAILED, 500), (HealthStatus.LOADING, 503),
    (HealthStatus.STANDBY, 503), (HealthStatus.SLEEPING, 503), (HealthStatus.WAKING, 503)])
def test_the_health_status_decides_the_http_status(status, http_status):
    assert Health(status).http_status == http_status


@pytest.mark.parametrize("value, kept", [
    (0, 0), (120, 120), (MAX_COUNTER - 1, MAX_COUNTER - 1),
    (MAX_COUNTER, None), (2 ** 70, None), (-1, None), (1.0, None), (1.0e300, None),
    (math.nan, None), ("12", None), (True, None), (None, None)])
def test_a_counter_is_an_int_below_max_counter(value, kept):
    assert counter(value) == kept


def test_stages_keep_only_finite_seconds_in_range_with_short_names():
    timings = {"weights_s": 1.5, "edge_s": MAX_STAGE_S, "zero_s": 0, "nan_s": math.nan, "inf_s": math.inf,
               "negative_s": -2.0, "years_s": MAX_STAGE_S * 2, "huge_int_s": 10 ** 400, "flag_s": True,
               "text_s": "3", "none_s": None, "x" * 10_000: 0.25}
    assert stages(timings) == {"weights_s": 1.5, "edge_s": MAX_STAGE_S, "zero_s": 0.0,
                               "x" * MAX_STAGE_NAME: 0.25}
    assert len(stages({f"s{i}": 0.1 for i in range(100_000)})) == MAX_STAGES
    assert stages(["weights_s"]) == stages(None) == stages("x") == {}


def test_health_bounds_what_it_keeps():
    health = Health.parse({"status": "failed", "model": "m" * 10_000, "error": "e" * 10_000,
                           "load_timings": {"total_s": math.inf},
                           "tensor_parallel": {"worker_pids": [1, -1, "2", True, 2 ** 70, *range(3, 200)]},
                           "engine_core": {"pid": 2 ** 70}})
    assert len(health.model or "") == len(health.error or "") == MAX_TEXT
    assert health.load_timings == {} and health.core_pid is None
    assert len(health.worker_pids) <= MAX_PIDS and health.worker_pids[0] == 1
    assert all(counter(p) == p for p in health.worker_pids)
    assert Health.parse({"status": "ready", "tensor_parallel": "x", "engine_core": [1]}) == \
        Health(HealthStatus.READY)


@pytest.mark.parametrize("body", [
    None, [], "ready", {}, {"status": "ok"}, {"status": ["ready"]}, {"status": {"x": 1}}, {"status": 200}])
def test_health_without_a_known_status_is_a_bad_reply(body):
    with pytest.raises(BadReply):
        Health.parse(body)


@pytest.mark.parametrize("body", [
    {"prompt_tokens": 2 ** 70, "completion_tokens": 1}, {"prompt_tokens": -1, "completion_tokens": 1},
    {"prompt_tokens": math.nan, "completion_tokens": 1}, {"prompt_tokens": True, "completion_tokens": 1},
    {"prompt_tokens": 12}, ["prompt_tokens", 12], None])
def test_stats_without_two_counters_are_a_bad_reply(body):
    with pytest.raises(BadReply):
        Stats.parse(body)


def test_stats_leave_out_what_is_out_of_range_beside_the_counters():
    stats = Stats.parse({"prompt_tokens": 1, "completion_tokens": 2, "requests": -5, "model": 7,
                         "items": 2 ** 70, "batches": "1", "compute_s": math.inf})
    assert stats == Stats(None, 0, 1, 2)


@pytest.mark.parametrize("host_bytes, kept", [(600, 600), (-1, None), (math.nan, None), (True, None),
                                              ("600", None), (2 ** 70, None)])
def test_a_sleepers_numbers_are_kept_only_in_range(host_bytes, kept):
    reply = SleepReply.parse({"host_bytes": host_bytes, "sleep_s": -1.0,
                              "freed_bytes": {"weights": 1, "kv_cache": "2"}})
    assert reply == SleepReply(kept, None, None)


def test_wake_timings_have_the_bounds_of_load_timings():
    reply = WakeReply.parse({"status": "ready", "wake_timings": {"weights_s": 0.5, "nan_s": math.nan,
                                                                "x" * 500: 1.0}})
    assert reply.wake_timings == {"weights_s": 0.5, "x" * MAX_STAGE_NAME: 1.0}
    assert WakeReply.parse({"status": "ready"}) == WakeReply({})
    with pytest.raises(BadReply):
        WakeReply.parse(["wake_timings"])


@pytest.mark.parametrize("body, param", [
    (["/m"], None),
    ({"model": "/m", "extra": 1}, "extra"),
    ({}, "model"),
    ({"model": ""}, "model"),
    ({"model": 3}, "model"),
    ({"model": "/m", "served_model_name": 3}, "served_model_name"),
    ({"model": "/m", "engine": [1]}, "engine"),
    ({"model": "/m", "engine": {"not_an_option": 1}}, "engine"),
])
def test_the_runtime_refuses_a_load_request_naming_the_field(body, param):
    with pytest.raises(ProtocolError) as refused:
        LoadRequest.parse(body, {"dtype"})
    assert refused.value.param == param and refused.value.status == 400


@pytest.mark.parametrize("name", ["0f3a9c2e11d4b7a6-adapter_model.safetensors", "a", "w.safetensors", "A_b-c.d"])
def test_an_inbox_file_name_is_one_plain_path_component(name):
    assert adapter_file(name) == name


@pytest.mark.parametrize("name", [
    "", ".", "..", "../x", "a/../b", "a/b", "/etc/passwd", ".hidden", "a..b", "a.", "a-", "a b", "a\n",
    "a\x00b", "a\\b", "é.safetensors", "a" * (MAX_ADAPTER_FILE + 1)])
def test_an_inbox_file_name_that_could_leave_the_folder_is_refused_naming_the_header(name):
    with pytest.raises(ProtocolError) as refused:
        adapter_file(name)
    assert refused.value.status == 400 and refused.value.param == ADAPTER_FILE_HEADER


def test_an_adapter_name_with_a_trailing_newline_is_no_name():
    """`$` matches before a final newline; the names are matched whole."""
    assert AdapterList.parse({"adapters": ["ok-1", "ok-1\n", "a/b"]}).names == ("ok-1",)
    with pytest.raises(BadReply):
        AdapterReply.parse({"name": "ok-1\n", "loaded": True})


# ---------------------------------------------------------------- likely models

def test_likely_models_round_trip_and_dedupe():
    from wire.replica_control import LikelyModels

    sent = LikelyModels(("/cache/models/a", "/cache/models/b"))
    assert LikelyModels.parse(over_the_wire(sent.to_json())) == sent
    assert LikelyModels.parse({"models": ["/m/a", "/m/b", "/m/a"]}).models == ("/m/a", "/m/b")
    assert LikelyModels.parse({"models": []}).models == ()


@pytest.mark.parametrize("body, param", [
    ([], None),
    ({"models": "/m/a"}, "models"),
    ({"model": ["/m/a"]}, "model"),
    ({"models": ["/m/a"], "extra": 1}, "extra"),
    ({"models": ["/m/a", 3]}, "models"),
    ({"models": [""]}, "models"),
    ({"models": ["/m/a\0b"]}, "models"),
    ({"models": ["/" + "x" * 4_096]}, "models"),
    ({"models": [f"/m/{i}" for i in range(5)]}, "models"),
])
def test_likely_models_refused_naming_the_field(body, param):
    from wire.replica_control import MAX_LIKELY_MODELS, MAX_MODEL_PATH, LikelyModels

    assert (MAX_LIKELY_MODELS, MAX_MODEL_PATH) == (4, 4_096)    # the bounds the cases step over
    with pytest.raises(ProtocolError) as refused:
        LikelyModels.parse(body)
    assert refused.value.status == 400
    assert refused.value.body()["error"].get("param") == param
