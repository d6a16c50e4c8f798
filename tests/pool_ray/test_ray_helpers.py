"""The Ray backend's pure helpers: no cluster needed."""
from __future__ import annotations

from pool.backends.ray import short_error, slots_from_nodes
from pool.backends.ray_actor import cache_entries
from pool.backends.runtime_args import engine_for
from pool.inventory import Slot
from tests.pool_ray.test_backend import CPU_ENGINE, spec_for
from spec.engine_options import ChosenOptions


def test_slots_come_from_alive_gpu_nodes_only():
    nodes = [{"NodeID": "head" * 14, "Alive": True, "Resources": {"CPU": 0.0}},
             {"NodeID": "a" * 56, "Alive": True, "Resources": {"GPU": 2.0, "CPU": 2.0}},
             {"NodeID": "b" * 56, "Alive": False, "Resources": {"GPU": 8.0}}]
    slots = slots_from_nodes(nodes, 10)
    assert [(s.slot_id, s.node, s.kind, s.memory_bytes, s.device_index) for s in slots] == [
        ("ray-aaaaaaaaaaaa/gpu0", "a" * 56, "cuda", 10, 0), ("ray-aaaaaaaaaaaa/gpu1", "a" * 56, "cuda", 10, 1)]
    assert all(s.exclusive for s in slots)          # an actor takes whole GPUs
    assert {s.cost_kind for s in slots} == {"cuda"}  # Ray detected no GPU type on the node


def test_a_node_of_a_detected_gpu_type_prices_its_slots_as_that_type():
    nodes = [{"NodeID": "a" * 56, "Alive": True, "Resources": {"GPU": 1.0, "accelerator_type:A100-80G": 1.0}},
             {"NodeID": "b" * 56, "Alive": True, "Resources": {"GPU": 1.0, "accelerator_type:L4": 1.0}}]
    assert [s.cost_kind for s in slots_from_nodes(nodes, 10)] == ["a100-80g", "l4"]


def test_engine_gets_plain_cuda_and_tensor_parallel_from_the_slots():
    cuda = [Slot("n/gpu0", "n", "cuda", 1, 0), Slot("n/gpu1", "n", "cuda", 1, 1)]
    assert engine_for(spec_for(engine=ChosenOptions()), cuda, 128, isolated=True) == {
        "kv_cache_tokens": 128, "device": "cuda", "tensor_parallel_size": 2}
    assert engine_for(spec_for(engine=ChosenOptions()), cuda[:1], 128, isolated=True)["device"] == "cuda"   # not cuda:0
    assert engine_for(spec_for(), cuda[:1], 128, isolated=True) == CPU_ENGINE


def test_cache_entries_lists_only_complete_entries(tmp_path):
    for key, files in (("done", ("data", "meta.json")), ("partial", ("data",))):
        (tmp_path / "objects" / key).mkdir(parents=True)
        for name in files:
            (tmp_path / "objects" / key / name).write_text("x")
    assert cache_entries(tmp_path) == ["done"]
    assert cache_entries(tmp_path / "absent") == []


def test_short_error_keeps_the_lines_that_say_why():
    message = ("The actor died unexpectedly before finishing this task.\n\tclass_name: ReplicaActor\n"
               "\tpid: 123\nThe actor died because its node has died. Node Id: abc")
    assert short_error(RuntimeError(message)) == (
        "The actor died unexpectedly before finishing this task. "
        "The actor died because its node has died. Node Id: abc")


def test_a_node_pulls_into_its_own_cache_with_its_own_budget(tmp_path, monkeypatch):
    from pool.backends.ray_actor import node_settings
    from pool.settings import PoolSettings

    pool = PoolSettings(cache_dir=tmp_path / "pool", cache_disk_budget_gb=50)
    monkeypatch.delenv("THAWPOOL_CACHE_DIR", raising=False)
    monkeypatch.delenv("THAWPOOL_CACHE_DISK_BUDGET_GB", raising=False)
    assert node_settings(pool) == pool
    monkeypatch.setenv("THAWPOOL_CACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("THAWPOOL_CACHE_DISK_BUDGET_GB", "12.5")
    assert (node_settings(pool).cache_dir, node_settings(pool).cache_disk_budget_gb) == (tmp_path / "node", 12.5)


def test_a_function_child_sees_only_plain_variables_the_pools_and_the_actors_gpus():
    from pool.launch import FunctionServer, ModelServer, ReplicaLaunch

    actor = {"PATH": "/bin", "HOME": "/h", "CUDA_VISIBLE_DEVICES": "3", "THAWPOOL_CACHE_DIR": "/node",
             "RAY_ADDRESS": "127.0.0.1:1", "AWS_SECRET_ACCESS_KEY": "s"}
    added = {"PYTHONPATH": "/src"}
    function = ReplicaLaunch(FunctionServer("rev-1", None), "/venv/bin/python", None, added, None)
    assert function.environment(actor, "r", ["3"]) == {"PATH": "/bin", "HOME": "/h", "CUDA_VISIBLE_DEVICES": "3",
                                                       "THAWPOOL_REPLICA_SECRET": "r", "PYTHONPATH": "/src"}
    assert "CUDA_VISIBLE_DEVICES" not in function.environment({"PATH": "/bin"}, "r", [])
    model = ReplicaLaunch(ModelServer("rev-1", {}), None, None, added, None)
    assert model.environment(actor, "r", ["3"]) == {**actor, **added, "THAWPOOL_REPLICA_SECRET": "r"}


def test_the_installers_answer_is_the_venv_or_its_reason(tmp_path):
    import pytest

    from pool.api import ColdStartFailed
    from pool.function_env import FunctionEnv, builder_command, built_env

    root = builder_command("/py", tmp_path / "pkg", tmp_path / "node" / "function-envs")[-2:]
    assert root == ["--root", str(tmp_path / "node" / "function-envs")]      # the node's own cache
    ok = b'{"python": "/e/bin/python", "cached": true, "seconds": 0.25}\n'
    assert built_env(0, ok, b"") == FunctionEnv("/e/bin/python", True, 0.25)
    with pytest.raises(ColdStartFailed, match="failed: installing requirements failed"):
        built_env(1, b'{"error": "installing requirements failed (1): no tinydep"}\n', b"")
    with pytest.raises(ColdStartFailed, match=r"failed \(-9\): Killed"):
        built_env(-9, b"", b"Killed")


def test_a_function_server_gets_its_arguments_from_its_launch_and_its_address_from_its_node(tmp_path):
    from pool.launch import FunctionServer, ReplicaLaunch

    launch = ReplicaLaunch(FunctionServer("rev-1", None), "/venv/bin/python", None, {}, None)
    assert launch.command("/venv/bin/python", str(tmp_path), "127.0.0.1", 9) == [
        "/venv/bin/python", "-m", "runtime.functions.server", "--package", str(tmp_path), "--served-model-name",
        "rev-1", "--max-open-files", "4096", "--host", "127.0.0.1", "--port", "9"]
    assert FunctionServer("rev-1", 3328).argv(str(tmp_path))[-2:] == ["--memory-limit-mb", "3328"]
