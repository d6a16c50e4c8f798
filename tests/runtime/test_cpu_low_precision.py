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


@pytest.mark.parametrize("flags, bf16_head", [
    (CpuFeatures(avx512_bf16=True), True),         # bf16 linears: the tied head gets a bf16 copy
    (CpuFeatures(avx512_vnni=True), False),        # int8 dot products only: fp32 linears, no copy
])
def test_a_tied_head_gets_its_own_copy_only_in_a_lower_precision(model_factory, monkeypatch, flags, bf16_head):
    import torch

    tied = model_factory(arch="llama", tie_word_embeddings=True)
    plain = LLM(str(tied), kv_cache_tokens=256).engine.runner.model
    assert plain.lm_head is plain.embed
    monkeypatch.setattr(decoder, "detect_cpu", lambda: flags)
    llm = LLM(str(tied), kv_cache_tokens=256, cpu_low_precision=True)
    model = llm.engine.runner.model
    assert model.embed.dtype == torch.float32                 # the embedding lookup keeps fp32
    if bf16_head:
        assert model.lm_head is not model.embed and model.lm_head.dtype == torch.bfloat16
        # the copy's bytes count with the weights (outside the layers' linears)
        ours, theirs = model.weight_memory(), plain.weight_memory()
        head = model.lm_head.numel() * 2
        assert ours.total_bytes - ours.linear_bytes == theirs.total_bytes - theirs.linear_bytes + head
    else:
        assert model.lm_head is model.embed
    out = llm.generate([[5, 6, 7, 8]], PARAMS)[0]
    fp32 = LLM(str(tied), kv_cache_tokens=256).generate([[5, 6, 7, 8]], PARAMS)[0]
    assert out.token_ids == fp32.token_ids
