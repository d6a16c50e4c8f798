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


# ---- int8 weights under W8A8: smoothed at load (runtime/load/smoothing.py)

VNNI = CpuFeatures(avx512_vnni=True)       # int8 dot products: W8A8 from W8A8_MIN_ROWS rows up


def _prompt_logits(llm: LLM, ids: list[int]):
    return llm.engine.runner.prompt_logits(ids)


def test_w8a8_smooths_the_int8_weights_at_load_and_keeps_no_channel_apart(tiny_model, monkeypatch):
    import torch

    from kernels.cpu import w8a8_linear

    if not w8a8_linear.available():
        pytest.skip("this torch has no torch._int_mm")
    ids = list(range(7, 71))                                  # 64 rows: every linear runs W8A8
    fp32 = _prompt_logits(LLM(str(tiny_model), kv_cache_tokens=256), ids)
    plain = LLM(str(tiny_model), kv_cache_tokens=256, quantization="int8")
    monkeypatch.setattr(decoder, "detect_cpu", lambda: VNNI)
    llm = LLM(str(tiny_model), kv_cache_tokens=256, quantization="int8", cpu_low_precision=True)
    model = llm.engine.runner.model
    assert model.smoothing and model.ops.int8_linear.many.keywords == {"outliers": 0}
    assert "calibrate_s" in {f"{k}_s" for k in llm.engine.load_timings}
    # the weights are not plain int8's (the smoothing went into them) ...
    assert not torch.equal(model.layers[0].qkv.qweight, plain.engine.runner.model.layers[0].qkv.qweight)
    assert not torch.equal(model.layers[0].attn_norm, plain.engine.runner.model.layers[0].attn_norm)
    # ... and the model still computes the same function, up to int8's rounding
    # (a random tiny model has no outlier channels, so smoothing cannot win here: within
    # 2x of weight-only int8's error; a wrong fold would be off by the logits' whole size)
    def error(logits) -> float:
        return ((logits - fp32).norm() / fp32.norm()).item()
    assert error(_prompt_logits(llm, ids)) < 2 * error(_prompt_logits(plain, ids))
    out = llm.generate([[5, 6, 7, 8]], PARAMS)[0]             # decode rows: the weight-only kernel
    assert out.token_ids == plain.generate([[5, 6, 7, 8]], PARAMS)[0].token_ids


@pytest.mark.parametrize("flags, quantization", [
    (CpuFeatures(), "int8"),                   # no int8 dot products: weight-only int8, unsmoothed
    (VNNI, None),                              # fp32 weights: nothing to smooth
])
def test_no_smoothing_without_w8a8(tiny_model, monkeypatch, flags, quantization):
    monkeypatch.setattr(decoder, "detect_cpu", lambda: flags)
    llm = LLM(str(tiny_model), kv_cache_tokens=256, quantization=quantization, cpu_low_precision=True)
    assert not llm.engine.runner.model.smoothing
    assert "calibrate" not in llm.engine.load_timings
