"""runtime/quantize: GPTQ and AWQ made by our own tooling. The folders they write read
back through the engine's reader as exactly the quantizer's own weights; GPTQ's error
correction beats plain rounding on the problem it solves; AWQ's folded scales leave the
float model as it was; the command's folders serve."""
from __future__ import annotations

import json

import pytest
import torch

from kernels.group_quant import GroupQuantized, dequantize_rows
from runtime import LLM, SamplingParams
from runtime.load.hf_quantized import gather, keep_dtype
from runtime.load.timings import LoadTimings
from runtime.load.weights import read_weights
from runtime.quantize import awq, calibration, gptq, writers
from runtime.quantize.__main__ import main
from runtime.quantize.groups import round_to_nearest
from runtime.quantize.layers import LayerRunner, read_model
from spec.quantization_config import scheme

GROUP = 32


def runner_for(model, samples: int = 4, length: int = 32) -> LayerRunner:
    ids = torch.randint(5, model.config.vocab_size, (samples * length,), generator=torch.Generator().manual_seed(0))
    return LayerRunner(model.config, calibration.sequences(ids.tolist(), samples, length))


def read_back(folder) -> dict[str, object]:
    s = scheme(json.loads((folder / "config.json").read_text()))
    assert s is not None
    return gather(read_weights(folder, torch.float32, "cpu", LoadTimings(), keep=keep_dtype(s)), s, torch.float32)


@pytest.mark.parametrize("method,desc_act", [("gptq", False), ("gptq", True), ("awq", False)])
def test_the_written_folder_reads_back_as_the_quantizers_weights(method, desc_act, tiny_model, tmp_path):
    model = read_model(tiny_model)
    runner = runner_for(model)
    if method == "gptq":
        linears = gptq.quantize_model(model, runner, GROUP, act_order=desc_act)
        config = writers.gptq_config(GROUP, desc_act, False, gptq.DAMP, true_sequential=False)
    else:
        linears = awq.quantize_model(model, runner, GROUP)
        config = writers.awq_config(GROUP)
    folder = writers.write_folder(tiny_model, tmp_path / method, model.tensors, linears, method, config)
    out = read_back(folder)
    assert len(linears) == 7 * model.config.num_hidden_layers
    for prefix, q in linears.items():
        w = out[prefix + ".weight"]
        assert isinstance(w, GroupQuantized) and (w.input_order is not None) == desc_act
        assert torch.equal(dequantize_rows(w, torch.arange(w.shape[0])), q.dequantized()), prefix
    if desc_act:
        assert not torch.equal(next(iter(linears.values())).g_idx, torch.arange(64) // GROUP)
    for name, t in model.tensors.items():           # the norms (AWQ: with its scales folded in), embedding
        if name.removesuffix(".weight") not in linears:
            assert torch.equal(out[name], t), name


def test_gptq_reconstructs_the_output_better_than_rounding():
    """||W X - W_q X|| over calibration inputs whose channels differ in scale and correlate."""
    g = torch.Generator().manual_seed(1)
    n, k, rows = 64, 256, 1024
    w = torch.randn(n, k, generator=g) * 0.02
    mixing = torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k)
    x = (torch.randn(rows, k, generator=g) @ mixing) * torch.exp(torch.randn(k, generator=g))
    hessian = gptq.Hessian(k)
    hessian.add(x)
    reference = x @ w.T
    rtn = round_to_nearest(w, GROUP, min_zero=gptq.MIN_ZERO).dequantized()
    errors = {"rtn": (reference - x @ rtn.T).norm().item()}
    for act_order in (False, True):
        q = gptq.gptq(w, hessian.value(), GROUP, act_order=act_order).dequantized()
        errors[f"gptq act_order={act_order}"] = (reference - x @ q.T).norm().item()
    assert errors["gptq act_order=False"] < 0.9 * errors["rtn"], errors
    # the channels differ in scale: taking the largest first leaves the most to correct them
    assert errors["gptq act_order=True"] < 0.7 * errors["rtn"], errors


def test_awq_scale_folding_leaves_the_float_layer_unchanged(model_factory):
    """Every fold, v -> o included (heads == kv heads: v's and o's shapes agree)."""
    model = read_model(model_factory(arch="llama", num_key_value_heads=4))
    runner = runner_for(model)
    layer = model.layer(0)
    h = runner.embed(model)
    expected, inputs = runner.forward(h, layer, 0)
    searched = awq.layer_scales(runner, layer, 0, inputs, GROUP)
    assert set(searched) == {"qkv", "o", "gate_up", "down"}
    g = torch.Generator().manual_seed(2)
    for scales in (searched, {site: torch.exp(torch.randn(s.shape, generator=g)) for site, s in searched.items()}):
        folded = awq.fold(layer, scales)
        assert not torch.equal(folded["self_attn.v_proj.weight"], layer["self_attn.v_proj.weight"])
        got, _ = runner.forward(h, folded, 0)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args", [["--method", "gptq", "--desc-act"], ["--method", "awq"], ["--method", "rtn"]])
def test_the_command_writes_a_folder_the_engine_serves(args, tiny_model, tmp_path):
    text = tmp_path / "calibration.txt"
    text.write_text("Serverless GPU pools scale to zero when idle and thaw on the first request. " * 40)
    out = tmp_path / "out"
    assert main([*args, "--group", str(GROUP), "--calibration", str(text), "--samples", "4", "--seq-len", "32",
                 str(tiny_model), str(out)]) == 0
    assert (out / "tokenizer.json").is_file()
    llm = LLM(str(out), kv_cache_tokens=256)
    assert isinstance(llm.engine.runner.model.layers[0].qkv, GroupQuantized)
    (result,) = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(result.token_ids) == 8


def test_what_cannot_be_quantized_is_refused(tiny_model, tmp_path, capsys):
    out = tmp_path / "rtn"
    assert main(["--method", "rtn", "--group", str(GROUP), str(tiny_model), str(out)]) == 0
    assert main(["--method", "rtn", "--group", str(GROUP), str(out), str(tmp_path / "again")]) == 2
    assert "quantized already" in capsys.readouterr().err
    # the tiny model's hidden size is 64: no whole group of 128
    assert main(["--method", "awq", "--group", "128", str(tiny_model), str(tmp_path / "awq")]) == 2
    assert "group 128 does not divide the 64 inputs of model.layers.0." in capsys.readouterr().err
