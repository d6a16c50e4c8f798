"""The stages of a cold start as the replica records them, the KV cache that is free to
allocate, and the standby that builds the kernels before any load is asked for."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.engine.llm_engine import LLMEngine
from runtime.models.kv_memory import zeros_untouched
from runtime.load.timings import STAGES, LoadTimings, process_age_s
from runtime.serve.model_host import build_llm_engine
from wire.replica_control import LoadRequest
from runtime.load.threads import parallel_map

REPO = Path(__file__).resolve().parents[2]
PAGE = 4096


def test_summary_names_each_stage_and_the_rest():
    timings = LoadTimings(weight_bytes=2_000_000_000)
    timings.add("weights", 0.5)
    timings.add("pack", 0.25)
    timings.add("pack", 0.25)
    assert timings.summary(total_s=1.5) == {"weights_s": 0.5, "pack_s": 0.5, "other_s": 0.5,
                                            "weights_gbps": 4.0, "total_s": 1.5}
    assert LoadTimings().weights_gbps() is None


def test_this_process_has_an_age():
    assert process_age_s() > 0


def test_the_engine_records_its_stages_in_order(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=256)
    recorded = set(engine.load_timings)
    assert {"config", "import", "kernels", "weights", "assemble", "pack", "kv_cache"} \
        <= recorded <= set(STAGES) - {"tokenizer"}     # the server's stage, not the engine's
    assert engine.load_record.weight_bytes == (tiny_model / "model.safetensors").stat().st_size


def test_a_folder_without_its_tokenizer_fails_the_load(tiny_model, tmp_path):
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_model, folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        LLMEngine(str(folder), kv_cache_tokens=256)


def test_the_replica_reports_stages_the_rest_and_the_rate(tiny_model):
    _, timings = build_llm_engine(LoadRequest(str(tiny_model), "tiny", {"kv_cache_tokens": 256}))
    assert timings["process_s"] == 0.0              # torch was in memory: not this load's process
    for key in ("import_s", "kernels_s", "weights_s", "pack_s", "kv_cache_s", "other_s"):
        assert 0 <= timings[key] <= timings["total_s"], key
    assert "weights_gbps" in timings


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def test_the_kv_cache_is_zeros_and_costs_memory_only_where_written():
    shape = (64, 2, 128, 16, 2, 64)                 # 256 MiB of fp32
    before = _resident_bytes()
    cache = zeros_untouched(shape, torch.float32, "cpu")
    # torch.zeros would have written all 256 MiB here
    assert _resident_bytes() - before < 16 << 20
    block = cache[3, 1, 7]                          # one block: 16 * 2 * 64 floats
    assert cache.shape == shape and cache.is_contiguous() and not block.any()
    block.fill_(1.0)
    assert float(cache.sum()) == block.numel()
    assert _resident_bytes() - before < 16 << 20
    assert not zeros_untouched((2, 3), torch.bfloat16, "cpu").any()


def test_an_engine_cache_reads_zero_before_any_request(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=256)
    assert all(not k.any() and not v.any() for k, v in engine.runner.kv_caches)


def test_parallel_map_keeps_order_and_uses_threads():
    import threading
    names = parallel_map(lambda i: (i, threading.current_thread().name), range(8), workers=2)
    assert [i for i, _ in names] == list(range(8))
    assert all(n.startswith("thawpool-load") for _, n in names)


@pytest.mark.skipif(sys.platform != "linux", reason="the C kernels are built on Linux")
def test_a_standby_builds_the_kernels_before_any_load():
    code = ("import sys; from runtime.serve.model_host import warm_imports; warm_imports('cpu'); "
            "print('kernels.cpu.rmsnorm' in sys.modules, 'kernels.cpu.linear' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=True)
    from kernels.cpu.build import compiler
    assert done.stdout.split() == [str(compiler() is not None), "True"]
