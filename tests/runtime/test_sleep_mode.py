"""Sleep and wake of an engine in process, on the CPU (runtime/core/sleep_mode.py,
runtime/engine/model_runner.py): what a sleep frees and says it freed, what a wake
restores, bit for bit, and that nothing else keeps the freed memory alive. The offload
to host memory that CUDA does is forced here with host memory standing in for the
device (WeightOffload without pinning); the HTTP side is tests/runtime_server/test_sleep_wake.py."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from runtime import SamplingParams
from runtime.core.sleep_mode import Freed, NotIdle
from runtime.engine.llm_engine import LLMEngine
from runtime.engine.model_runner import WeightOffload, weight_offload
from runtime.load.quantization import Int8Weight

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [list(range(5, 30)), list(range(40, 49))]
BLOCK, TOKENS = 8, 256


def _weights(model) -> dict[str, torch.Tensor]:
    """Every weight tensor of the model by a name of its place (an Int8Weight as its two)."""
    out: dict[str, torch.Tensor] = {}

    def add(name: str, value) -> None:
        if isinstance(value, Int8Weight):
            out[f"{name}.qweight"], out[f"{name}.scale"] = value.qweight, value.scale
        elif isinstance(value, torch.Tensor):
            out[name] = value

    for i, layer in enumerate(model.layers):
        for field, value in vars(layer).items():
            add(f"layers.{i}.{field}", value)
    for name in ("embed", "norm", "lm_head"):
        add(name, getattr(model, name))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def _generate(engine: LLMEngine, tag: str) -> tuple[list[list[int]], int]:
    """PROMPTS' greedy tokens, and how many prompt tokens the prefix cache gave them."""
    hits = engine.stats().prefix_cache_hits
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"{tag}-{i}", prompt, GREEDY)
    tokens: dict[str, list[int]] = {f"{tag}-{i}": [] for i in range(len(PROMPTS))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return list(tokens.values()), engine.stats().prefix_cache_hits - hits


def _kv_bytes(engine: LLMEngine) -> int:
    return sum(k.nbytes + v.nbytes for k, v in engine.runner.kv_caches)


def test_only_cuda_offloads_weights_and_pins_their_host_copies():
    assert weight_offload("cpu") is None
    assert weight_offload("cuda") == WeightOffload("cuda", pin=True)
    assert weight_offload("cuda:1") == WeightOffload("cuda:1", pin=True)


def test_on_cuda_a_wake_waits_for_its_copies_then_unpins_the_host_copies(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append(f"synchronize {device}"))
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", lambda: calls.append("empty_host_cache"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    offload = WeightOffload("cuda:1", pin=True)
    offload.release()
    offload.settle()
    assert calls == ["empty_cache", "synchronize cuda:1", "empty_host_cache"]
    calls.clear()
    WeightOffload("cpu", pin=False).release()
    WeightOffload("cpu", pin=False).settle()
    assert calls == []


@pytest.mark.parametrize("arch, quantization", [("llama", None), ("qwen2", None), ("llama", "int8")],
                         ids=["llama", "qwen2-tied-head", "llama-int8"])
def test_an_offloaded_sleep_restores_every_weight_bit_for_bit(model_factory, arch, quantization):
    engine = LLMEngine(str(model_factory(arch=arch)), dtype="bfloat16", quantization=quantization,
                       kv_cache_tokens=TOKENS, block_size=BLOCK)
    runner = engine.runner
    runner.offload = WeightOffload("cpu", pin=False)        # host memory stands in for the device
    before, _ = _generate(engine, "before")
    weights = _weights(runner.model)
    reference = {name: (t.dtype, t.shape, _bits(t).clone()) for name, t in weights.items()}
    tied = runner.model.lm_head is runner.model.embed
    assert tied == (arch == "qwen2")
    gone = [weakref.ref(t) for t in weights.values()] + [weakref.ref(k) for kv in runner.kv_caches for k in kv]
    kv_bytes, weight_bytes = _kv_bytes(engine), runner.model.weight_memory().total_bytes
    del weights

    freed = engine.sleep()
    gc.collect()
    assert freed == Freed(weight_bytes=weight_bytes, kv_cache_bytes=kv_bytes, host_bytes=weight_bytes)
    assert freed.device_bytes == weight_bytes + kv_bytes
    assert runner.kv_caches == [] and runner.graphs is None
    assert [ref() for ref in gone] == [None] * len(gone), "a freed weight or cache block is still referenced"
    asleep = _weights(runner.model)
    assert asleep.keys() == reference.keys()
    assert (runner.model.lm_head is runner.model.embed) == tied      # a tied head stays one tensor

    timings = engine.wake()
    awake = _weights(runner.model)
    for name, (dtype, shape, bits) in reference.items():
        assert (awake[name].dtype, awake[name].shape, awake[name].device.type) == (dtype, shape, "cpu"), name
        assert torch.equal(_bits(awake[name]), bits), name
    assert (runner.model.lm_head is runner.model.embed) == tied
    assert timings.weight_bytes == weight_bytes and {"weights_s", "kv_cache_s"} <= set(timings.summary(0.0))
    assert _kv_bytes(engine) == kv_bytes and all(not k.any() and not v.any() for k, v in runner.kv_caches)
    assert _generate(engine, "after") == (before, 0)


def test_a_cpu_sleep_frees_the_kv_cache_and_keeps_the_weights_in_place(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=TOKENS, block_size=BLOCK)
    before, _ = _generate(engine, "first")
    again, hits = _generate(engine, "again")
    assert again == before and hits > 0                      # the prefix cache holds the prompts' blocks
    runner = engine.runner
    places = {name: t.data_ptr() if not t.is_mkldnn else id(t) for name, t in _weights(runner.model).items()}
    kv_bytes, weight_bytes = _kv_bytes(engine), runner.model.weight_memory().total_bytes
    assert kv_bytes == 2 * 2 * (TOKENS // BLOCK) * BLOCK * 2 * 16 * 4     # layers, k/v, blocks, slots, heads, dim, fp32

    freed = engine.sleep()
    assert freed == Freed(weight_bytes=0, kv_cache_bytes=kv_bytes, host_bytes=weight_bytes)
    assert runner.kv_caches == [] and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    timings = engine.wake()
    assert timings.weight_bytes == 0
    assert {name: t.data_ptr() if not t.is_mkldnn else id(t) for name, t in _weights(runner.model).items()} == places
    assert _kv_bytes(engine) == kv_bytes and all(not k.any() and not v.any() for k, v in runner.kv_caches)
    assert _generate(engine, "after") == (before, 0), "the prefix cache was dropped with the KV cache"


def test_an_engine_holding_a_request_refuses_to_sleep(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=TOKENS, block_size=BLOCK)
    engine.add_request("a", PROMPTS[0], GREEDY)
    with pytest.raises(NotIdle):
        engine.sleep()
    assert engine.runner.kv_caches, "a refused sleep frees nothing"
