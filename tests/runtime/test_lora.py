"""LoRA adapters in the engine (runtime/lora/): one batch mixing the base model and four
random PEFT adapters of different ranks and targets, greedy tokens equal to transformers
with peft applying each adapter, on two architectures; the slots hold fewer adapters
than the requests use (the scheduler waits for a slot and swaps the least recently
used); no prefix-cache block is shared across adapters; what the engine cannot apply is
refused naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.lora.slots import AdapterSlots
from tests.runtime.exactness import prompts
from tests.support.peft_adapters import ALL_MODULES, make_adapter, peft_greedy

pytest.importorskip("peft", reason="peft is not installed (pyproject's test extra pins it)")

NEW_TOKENS = 12
ARCHS = {"llama": dict(arch="llama"), "qwen2": dict(arch="qwen2")}
# rank, target modules: every projection, attention only, MLP only, two of q/k/v
ADAPTERS = [(8, ALL_MODULES), (2, ["q_proj", "v_proj"]), (16, ["gate_proj", "up_proj", "down_proj"]),
            (4, ["k_proj", "o_proj"])]


@pytest.fixture(scope="module", params=sorted(ARCHS))
def base_and_adapters(request, model_factory, tmp_path_factory):
    base = model_factory(**ARCHS[request.param])
    tmp = tmp_path_factory.mktemp(f"lora-{request.param}")
    adapters = {f"a{i}": make_adapter(base, tmp / f"a{i}", rank, targets, seed=i)
                for i, (rank, targets) in enumerate(ADAPTERS)}
    return base, adapters


def _reference(base: Path, adapter, prompt: list[int]) -> list[int]:
    return peft_greedy(base, adapter, prompt, NEW_TOKENS)


def _run(llm: LLM, jobs: list[tuple[list[int], str | None]]) -> list[list[int]]:
    """Every job's greedy tokens, all added before the first step (one mixed batch)."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate([p for p, _ in jobs], params, lora=[n for _, n in jobs])]


def _engine(base: Path, adapters: dict[str, Path], **options) -> LLM:
    llm = LLM(str(base), kv_cache_tokens=2048, block_size=8, **{"max_loras": 4, "max_lora_rank": 16, **options})
    for name, folder in adapters.items():
        llm.engine.add_lora(name, str(folder))
    return llm


def test_one_batch_of_four_adapters_and_the_base_matches_peft(base_and_adapters):
    base, adapters = base_and_adapters
    names = [None, *adapters, "a1", None]
    batch = prompts(7, [11, 5, 17, 9, 23, 6, 14])
    jobs = list(zip(batch, names))
    expected = [_reference(base, adapters[n] if n else None, p) for p, n in jobs]
    assert _run(_engine(base, adapters), jobs) == expected
    # the adapters change the output: the same prompt under each gives different tokens
    same = prompts(8, [12])[0]
    assert len({tuple(_reference(base, adapters[n] if n else None, same)) for n in [None, *adapters]}) > 2


def test_more_adapters_than_slots_wait_and_swap(base_and_adapters):
    base, adapters = base_and_adapters
    batch = prompts(9, [8, 13, 6, 10, 15, 7])
    names = ["a0", "a1", "a2", "a3", "a0", "a2"]
    jobs = list(zip(batch, names))
    llm = _engine(base, adapters, max_loras=2)
    assert _run(llm, jobs) == [_reference(base, adapters[n], p) for p, n in jobs]
    assert llm.engine.scheduler.adapters.pins == {}


def test_no_prefix_block_is_shared_across_adapters(base_and_adapters):
    base, adapters = base_and_adapters
    prompt = prompts(10, [40])[0]
    llm = _engine(base, adapters)
    first = _run(llm, [(prompt, "a0")])
    hits = llm.engine.stats().prefix_cache_hits
    assert _run(llm, [(prompt, "a1")]) == [_reference(base, adapters["a1"], prompt)]
    assert llm.engine.stats().prefix_cache_hits == hits, "a1 reused a0's blocks"
    assert _run(llm, [(prompt, "a0")]) == first
    assert llm.engine.stats().prefix_cache_hits > hits, "a0's own blocks were not reused"


def _edited(folder: Path, tmp_path: Path, **changes) -> Path:
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    settings = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**settings, **changes}))
    return copy


@pytest.mark.parametrize("changes, field", [
    ({"r": 32}, "r"), ({"use_dora": True}, "use_dora"), ({"bias": "lora_only"}, "bias"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target_modules"), ({"peft_type": "IA3"}, "peft_type"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"), ({"modules_to_save": ["lm_head"]}, "modules_to_save")])
def test_what_the_engine_cannot_apply_is_refused_naming_the_field(base_and_adapters, tmp_path, changes, field):
    base, adapters = base_and_adapters
    llm = _engine(base, {})
    with pytest.raises(ValueError, match=f"^{field}:"):
        llm.engine.add_lora("bad", str(_edited(adapters["a0"], tmp_path, **changes)))


def test_an_adapter_of_another_base_and_unknown_names_are_refused(base_and_adapters, model_factory):
    base, adapters = base_and_adapters
    wide = _engine(model_factory(arch="llama", hidden_size=96, intermediate_size=192), {})
    with pytest.raises(ValueError, match="another base model"):
        wide.engine.add_lora("a0", str(adapters["a0"]))
    llm = _engine(base, {"a0": adapters["a0"]})
    with pytest.raises(ValueError, match="^lora: no adapter named 'nope'"):
        llm.engine.add_request("x", [5, 6, 7], SamplingParams(max_tokens=2), lora="nope")
    with pytest.raises(ValueError, match="^lora: an adapter named 'a0'"):
        llm.engine.add_lora("a0", str(adapters["a0"]))
    without = LLM(str(base), kv_cache_tokens=256)
    with pytest.raises(ValueError, match="max_loras is 0"):
        without.engine.add_lora("a0", str(adapters["a0"]))


def test_an_adapter_in_use_is_not_removed(base_and_adapters):
    base, adapters = base_and_adapters
    llm = _engine(base, {"a0": adapters["a0"]})
    llm.engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=4), lora="a0")
    with pytest.raises(ValueError, match="in use"):
        llm.engine.remove_lora("a0")
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    llm.engine.remove_lora("a0")
    assert "a0" not in llm.engine.adapters


def test_slots_place_reuse_and_evict_the_least_recently_used_unpinned():
    slots = AdapterSlots(2)
    assert slots.place("a") == (0, True) and slots.place("b") == (1, True)
    slots.pin("a")
    assert slots.place("a") == (0, False)          # resident: no load, and now most recent
    assert slots.place("c") == (1, True)           # b was unpinned: evicted
    slots.pin("c")
    assert slots.place("d") is None                # both pinned
    slots.unpin("a")
    assert slots.place("d") == (0, True)
    assert not slots.forget("c") and slots.forget("d") and "d" not in slots.slot_of


def test_samples_and_structured_outputs_run_with_their_adapter(base_and_adapters):
    """n = 2 greedy samples both decode the adapter's tokens; a guided regex holds under an
    adapter beside an unguided request of another."""
    import re

    from wire.requests import parse_request

    base, adapters = base_and_adapters
    llm = _engine(base, adapters)
    prompt = prompts(11, [9])[0]
    twice = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, n=2)
    outs = llm.generate([prompt], twice, lora="a2")
    assert [o.token_ids for o in outs] == [_reference(base, adapters["a2"], prompt)] * 2
    regex = parse_request("completions", {"prompt": "x", "max_tokens": 16, "temperature": 1.0, "seed": 3,
                                          "guided_regex": r"[a-f]{2,4}-[0-9]{3}"}).params
    plain = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    guided, other = llm.generate([prompt, prompt], [regex, plain], lora=["a0", "a3"])
    assert re.fullmatch(r"[a-f]{2,4}-[0-9]{3}", guided.text), guided.text
    assert other.token_ids == _reference(base, adapters["a3"], prompt)


@pytest.mark.parametrize("options", [{"quantization": "int8"}, {"dtype": "bfloat16"}])
def test_int8_and_bf16_bases_take_adapters(base_and_adapters, tmp_path, options):
    """An adapter whose B is zero leaves the base's tokens as they are; a random one
    changes them (its delta reaches the int8 and bf16 projections)."""
    from safetensors.torch import load_file, save_file

    base, adapters = base_and_adapters
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "adapter_config.json").write_text((adapters["a0"] / "adapter_config.json").read_text())
    tensors = load_file(str(adapters["a0"] / "adapter_model.safetensors"))
    save_file({k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in tensors.items()},
              str(zero / "adapter_model.safetensors"))
    llm = _engine(base, {"a0": adapters["a0"], "zero": zero}, **options)
    prompt = prompts(12, [10])[0]
    base_tokens, zero_tokens, a0_tokens = _run(llm, [(prompt, None), (prompt, "zero"), (prompt, "a0")])
    assert zero_tokens == base_tokens != a0_tokens


def test_an_adapter_from_bytes_is_the_folders_and_pickles_as_one_shared_buffer(base_and_adapters):
    """What the server reads from a PUT's bytes is what add_lora reads from the folder; it
    crosses the engine-core pipe (torch's pickler) as one shared segment, not its data."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from runtime.core.config import ModelConfig
    from runtime.lora.adapter import adapter_from_bytes, read_adapter
    from runtime.lora.files import adapter_files
    from runtime.lora.shared_buffers import SharedBuffers
    from safetensors.torch import load_file

    base, adapters = base_and_adapters
    config, folder = ModelConfig.from_dir(str(base)), adapters["a0"]
    settings, weights = adapter_files(folder)
    from_folder = read_adapter("a0", folder, config, 16)
    sent = adapter_from_bytes("a0", settings, weights, config, 16, shared=SharedBuffers())
    assert sent.flat.is_shared() and not from_folder.flat.is_shared()
    assert torch.equal(sent.flat, from_folder.flat)
    file_b = load_file(str(folder / "adapter_model.safetensors"))[
        "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert torch.equal(sent.weights[(1, "down_proj")][1], file_b * 2.0)     # B scaled by alpha / r
    dumped = ForkingPickler.dumps(sent)
    assert len(dumped) < sent.flat.nbytes // 4, "the buffer's data went into the pickle"
    received = pickle.loads(dumped)
    storages = {t.untyped_storage().data_ptr() for pair in received.weights.values() for t in pair}
    assert storages == {received.flat.untyped_storage().data_ptr()}
    assert torch.equal(received.flat, sent.flat) and received.weights.keys() == sent.weights.keys()
    with pytest.raises(ValueError, match="^adapter_model.safetensors: .*data_offsets"):
        adapter_from_bytes("cut", settings, weights[:-4], config, 16)
