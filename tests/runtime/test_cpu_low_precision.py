"""The engine's cpu_low_precision option: off by default (an fp32 model computes in fp32
on any CPU), on it takes the GEMMs kernels/cpu/features.py plans for the CPU's flags.
This CPU's own flags may have none, so the flags are made up here (the paths then run
emulated by oneDNN)."""
from __future__ import annotations

import pytest

from kernels.cpu.build import NativeUnavailable
from kernels.cpu.features import CpuFeatures
from runtime import LLM, SamplingParams
from runtime.models import decoder

try:
    from kernels.cpu import bf16_linear, linear
except NativeUnavailable as exc:
    pytest.skip(f"CPU C kernels unavailable: {exc}", allow_module_level=True)

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=1)


def test_off_by_default_even_where_the_cpu_has_bf16(tiny_model, monkeypatch):
    monkeypatch.setattr(decoder, "detect_cpu", lambda: CpuFeatures(avx512_bf16=True))
    llm = LLM(str(tiny_model), kv_cache_tokens=256)
    assert llm.engine.runner.model.ops.linear is linear.linear


def test_on_it_runs_bf16_linears_close_to_fp32(tiny_model, monkeypatch):
    fp32 = LLM(str(tiny_model), kv_cache_tokens=256).generate([[5, 6, 7, 8]], PARAMS)[0]
    monkeypatch.setattr(decoder, "detect_cpu", lambda: CpuFeatures(avx512_bf16=True))
    llm = LLM(str(tiny_model), kv_cache_tokens=256, cpu_low_precision=True)
    assert llm.engine.runner.model.ops.linear is bf16_linear.linear
    out = llm.generate([[5, 6, 7, 8]], PARAMS)[0]
    assert out.token_ids == fp32.token_ids
    for (ours, _), (theirs, _) in zip(out.logprobs, fp32.logprobs):
        assert ours == pytest.approx(theirs, abs=0.05)      # bf16's rounding, not a wrong weight
