"""The model catalogue: bf16 weights, the tensor-parallel rule, and the size mix."""
import pytest

from poolsim.catalogue import CATALOGUE, CatalogueEntry, gpu_count, model_shape, size_mix, weight_bytes

GIB = 2 ** 30


def shape(name, gpu_memory=80 * GIB, headroom=0.3):
    entry = next(e for e in CATALOGUE if e.name == name)
    return model_shape(entry, gpu_memory, headroom, max_gpus=8)


def test_weights_are_two_bytes_a_parameter():
    assert weight_bytes(70.0) == 140_000_000_000
    assert weight_bytes(0.5) == 1_000_000_000


def test_gpu_count_is_the_smallest_power_of_two_holding_weights_and_headroom():
    assert [shape(e.name).gpu_count for e in CATALOGUE] == [1, 1, 1, 1, 1, 1, 2, 4]
    assert shape("llama-3-70b", gpu_memory=141 * 10 ** 9).gpu_count == 2     # an H200
    assert shape("llama-3-70b", headroom=0.0).gpu_count == 2                  # 140 GB fits 2 x 80 GiB
    assert shape("llama-2-13b", gpu_memory=24 * GIB).gpu_count == 2           # 33.8 GB on 24 GiB cards


def test_gpu_count_is_exact_at_the_boundary():
    assert gpu_count(100, gpu_memory_bytes=130, headroom=0.3, max_gpus=8) == 1
    assert gpu_count(101, gpu_memory_bytes=130, headroom=0.3, max_gpus=8) == 2


def test_a_model_too_big_for_max_gpus_is_refused():
    with pytest.raises(ValueError, match="more than 8 GPUs"):
        model_shape(CatalogueEntry("huge", 405.0), 80 * GIB, 0.3, max_gpus=8)


def test_bigger_models_are_rarer_by_the_power_rule():
    mix = size_mix(CATALOGUE, skew=0.5)
    assert sum(mix) == pytest.approx(1.0)
    assert list(mix) == sorted(mix, reverse=True)
    assert [round(p, 3) for p in mix] == [0.344, 0.199, 0.141, 0.092, 0.086, 0.068, 0.042, 0.029]
    assert mix[0] / mix[-1] == pytest.approx((70 / 0.5) ** 0.5)
    assert size_mix(CATALOGUE, skew=0.0) == pytest.approx([1 / 8] * 8)
