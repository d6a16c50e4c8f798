"""pool/inventory.py: a node's slots and the GPU type the cost book prices them as."""
from __future__ import annotations

import stat

import pytest

from pool.inventory import accelerator_type, cpu_slots, cuda_slots, probe_cuda, slots_of_devices
from pool.settings import PoolSettings

H100 = (85_899_345_920, "NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("name, kind", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100-PCIE-40GB", "a100"),
    ("Tesla T4", "t4"), ("NVIDIA L4", "l4"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA", ""), ("", "")])
def test_a_gpu_type_is_its_model_without_vendor_memory_or_form(name, kind):
    assert accelerator_type(name) == kind


def test_gpu_slots_carry_their_type_unless_the_node_names_one():
    slots = slots_of_devices([H100, H100], PoolSettings(node="n1"))
    assert [(s.slot_id, s.kind, s.device_index, s.cost_kind) for s in slots] == [
        ("n1/cuda0", "cuda", 0, "h100"), ("n1/cuda1", "cuda", 1, "h100")]
    named = slots_of_devices([H100], PoolSettings(gpu_kind="h100-sxm-reserved"))
    assert named[0].cost_kind == "h100-sxm-reserved"
    assert slots_of_devices([(1, "")], PoolSettings())[0].cost_kind == "cuda"     # no model in the name


def test_cpu_slots_are_priced_as_cpu():
    assert {s.cost_kind for s in cpu_slots(PoolSettings(cpu_slots=2))} == {"cpu"}


def fake_python(tmp_path, prints: str):
    """An interpreter that answers the probe with `prints`, whatever it is asked."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\necho '{prints}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_probe_reads_each_device_memory_and_name(tmp_path):
    python = fake_python(tmp_path, '[[85899345920, "NVIDIA H100 80GB HBM3"], [23034462208, "NVIDIA L4"]]')
    assert probe_cuda(python) == [H100, (23034462208, "NVIDIA L4")]
    slots = cuda_slots(PoolSettings(runtime_python=python))
    assert [s.cost_kind for s in slots] == ["h100", "l4"]


def test_a_probe_that_answers_nonsense_finds_no_gpu(tmp_path):
    assert probe_cuda(fake_python(tmp_path, "[1, 2]")) == []        # the old shape: memories alone
    assert probe_cuda(fake_python(tmp_path, "not json")) == []
