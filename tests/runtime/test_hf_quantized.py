"""HF quantized checkpoints repacked into the engine's layouts: each format's tensors, made
by its documented packing (tests/support/quant_packers.py), gathered into one weight whose
values are bit for bit the format's own dequantization in float32; and a tiny Llama saved
as such a folder read back through read_weights."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from kernels import fp8, group_quant
from kernels.fp8 import Fp8Weight
from kernels.group_quant import GroupQuantized
from runtime.load.hf_quantized import gather, keep_dtype
from runtime.load.quantization import Int8Weight
from runtime.load.timings import LoadTimings
from runtime.load.weights import read_weights
from spec.quantization_config import QuantizationScheme, scheme
from tests.support import quant_packers as qp

N, K = 48, 256
P = "model.layers.0.self_attn.q_proj"


def awq_config(group: int) -> dict:
    return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}


def gptq_config(group, desc_act: bool, sym: bool) -> dict:
    return {"quant_method": "gptq", "bits": 4, "group_size": group or -1, "desc_act": desc_act, "sym": sym,
            "checkpoint_format": "gptq"}


def ct_config(fmt: str, weights: dict, inputs=None) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}},
            "ignore": ["lm_head"]}


def w4a16_config(group, sym: bool, actorder: bool = False) -> dict:
    return ct_config("pack-quantized", {
        "num_bits": 4, "type": "int", "symmetric": sym, "dynamic": False,
        "strategy": "group" if group else "channel", "group_size": group,
        "actorder": "group" if actorder else None})


W8A8 = ct_config("int-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                                   "dynamic": False},
                 {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True})
FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def weight(n: int = N, k: int = K, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def gathered(parts: dict[str, torch.Tensor], config: dict) -> object:
    s = scheme({"quantization_config": config})
    assert s is not None
    out = gather({f"{P}.{name}": t for name, t in parts.items()} | {"model.norm.weight": torch.ones(4)}, s,
                 torch.float32)
    assert set(out) == {f"{P}.weight", "model.norm.weight"}
    return out[f"{P}.weight"]


def exactly(w: GroupQuantized, reference: torch.Tensor) -> None:
    """w's values, in x's column order, are the reference's bit for bit (and the packers
    quantized the float weight: within half a 4-bit step of it)."""
    values = group_quant.dequantize_rows(w, torch.arange(w.shape[0]))
    assert torch.equal(values, reference)
    assert (reference - weight(*reference.shape)).abs().max() < 0.03


@pytest.mark.parametrize("group", [32, 64, 128])
def test_awq_is_its_own_dequantization(group):
    parts = qp.awq_pack(weight(), group)
    w = gathered(parts, awq_config(group))
    assert isinstance(w, GroupQuantized) and (w.bits, w.group, w.input_order) == (4, group, None)
    assert w.scales.dtype == torch.float16 and w.codes.shape == (N, K // 2)
    exactly(w, qp.awq_dequantize(parts, group))


@pytest.mark.parametrize("group", [32, 64, 128, None])
@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("sym", [True, False])
def test_gptq_is_its_own_dequantization(group, desc_act, sym):
    parts = qp.gptq_pack(weight(), group, desc_act, sym)
    w = gathered(parts, gptq_config(group, desc_act, sym))
    assert isinstance(w, GroupQuantized) and w.bits == 4 and w.group == (group or K)
    assert (w.input_order is not None) == (desc_act and group is not None)
    if sym:      # offsets -8 s: float16 holds them
        assert w.offsets is not None and w.offsets.dtype == torch.float16
    exactly(w, qp.gptq_dequantize(parts))


def test_gptq_act_order_takes_x_in_its_order():
    parts = qp.gptq_pack(weight(), 32, desc_act=True, sym=False)
    w = gathered(parts, gptq_config(32, True, False))
    x = torch.randn(3, K)
    assert torch.allclose(group_quant.linear_ref(x, w), x @ qp.gptq_dequantize(parts).T, atol=1e-5)


def test_a_row_not_a_multiple_of_32_per_channel_takes_8_bit_codes():
    parts = qp.gptq_pack(weight(k=40), None, desc_act=False, sym=False)
    w = gathered(parts, gptq_config(None, False, False))
    assert isinstance(w, GroupQuantized) and (w.bits, w.group) == (8, 40)
    exactly(w, qp.gptq_dequantize(parts))


@pytest.mark.parametrize("group", [32, 128, None])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_compressed_tensors_w4a16_is_its_own_dequantization(group, sym, scale_dtype):
    parts = qp.ct_pack(weight(), group, sym, scale_dtype)
    w = gathered(parts, w4a16_config(group, sym))
    assert isinstance(w, GroupQuantized) and (w.bits, w.group) == (4, group or K)
    assert w.scales.dtype == torch.float16          # bfloat16 scales of this range: float16 holds them
    exactly(w, qp.ct_dequantize(parts))


def test_compressed_tensors_actorder_and_unpacked_zero_points():
    parts = qp.ct_pack(weight(), 64, sym=False, scale_dtype=torch.bfloat16, actorder=True, zero_packed=False)
    w = gathered(parts, w4a16_config(64, False, actorder=True))
    assert isinstance(w, GroupQuantized) and w.input_order is not None
    exactly(w, qp.ct_dequantize(parts))


def test_float32_scales_a_4_bit_product_would_round_take_signed_8_bit_codes():
    parts = qp.ct_pack(weight(), 32, sym=False, scale_dtype=torch.float32)
    w = gathered(parts, w4a16_config(32, False))
    assert isinstance(w, GroupQuantized) and w.bits == 8 and w.offsets is None
    exactly(w, qp.ct_dequantize(parts))


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_compressed_tensors_w8a8_is_an_int8_weight(scale_dtype):
    parts = qp.int8_pack(weight(), scale_dtype)
    w = gathered(parts, W8A8)
    assert isinstance(w, Int8Weight) and w.qweight.dtype == torch.int8 and w.scale.shape == (N,)
    assert torch.equal(w.qweight.float() * w.scale[:, None], qp.int8_dequantize(parts))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("config", [FP8_CONFIG, ct_config("float-quantized", {
    "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False},
    {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True})], ids=["fp8", "compressed-tensors"])
def test_fp8_is_an_fp8_weight(per_channel, config):
    parts = qp.fp8_pack(weight(), per_channel)
    w = gathered(parts, config)
    assert isinstance(w, Fp8Weight) and w.scale.shape == ((N,) if per_channel else ())
    assert torch.equal(fp8.dequantize(w), qp.fp8_dequantize(parts))


def test_scales_keep_their_dtype_and_codes_are_kept_whatever_the_engine_dtype():
    s = scheme({"quantization_config": awq_config(128)})
    assert s is not None
    keep = keep_dtype(s)
    assert keep(f"{P}.scales") and not keep(f"{P}.bias") and not keep("model.embed_tokens.weight")
    w8 = scheme({"quantization_config": W8A8})
    assert w8 is not None and keep_dtype(w8)(f"{P}.weight_scale") and not keep_dtype(w8)("lm_head.weight")


def test_the_linears_of_a_checkpoint_share_their_scale_and_offset_dtypes():
    """Scales float16 where exact: one linear whose bfloat16 scales float16 cannot hold
    (a subnormal there) widens every linear's, so q, k and v still stack."""
    s = scheme({"quantization_config": w4a16_config(32, True)})
    assert s is not None
    raw = {}
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        parts = qp.ct_pack(weight(seed=i), 32, True, torch.bfloat16)
        if proj == "v_proj":
            parts["weight_scale"][0, 0] = 2.0 ** -20 * 1.5078125        # 8 significant bits at 2^-20
        raw |= {f"model.layers.0.self_attn.{proj}.{n}": t for n, t in parts.items()}
    out = gather(raw, s, torch.float32)
    ws = [out[f"model.layers.0.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")]
    assert all(isinstance(w, GroupQuantized) and w.scales.dtype == torch.float32 for w in ws)
    fused = group_quant.stack_rows(ws)
    assert fused is not None and fused.shape == (3 * N, K)


def test_a_g_idx_whose_groups_are_not_all_full_is_refused_naming_the_linear():
    parts = qp.gptq_pack(weight(), 32, desc_act=False, sym=True)
    parts["g_idx"] = torch.zeros(K, dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^{P}: g_idx"):
        gathered(parts, gptq_config(32, False, True))


def test_a_missing_part_is_refused_naming_it():
    parts = qp.awq_pack(weight(), 32)
    del parts["qzeros"]
    with pytest.raises(ValueError, match=rf"^{P}: no {P}.qzeros in the checkpoint"):
        gathered(parts, awq_config(32))


# -- a tiny Llama saved as each format and read back -------------------------------------

FOLDERS = {
    "awq": (awq_config(32), lambda w: qp.awq_pack(w, 32), lambda t: qp.awq_dequantize(t, 32)),
    "gptq-desc-act": (gptq_config(32, True, False), lambda w: qp.gptq_pack(w, 32, True, False), qp.gptq_dequantize),
    "w4a16": (w4a16_config(32, False), lambda w: qp.ct_pack(w, 32, False, torch.bfloat16), qp.ct_dequantize),
    "w8a8": (W8A8, lambda w: qp.int8_pack(w, torch.bfloat16), qp.int8_dequantize),
    "fp8": (FP8_CONFIG, lambda w: qp.fp8_pack(w, True), qp.fp8_dequantize),
}


def values(w: object) -> torch.Tensor:
    if isinstance(w, GroupQuantized):
        return group_quant.dequantize_rows(w, torch.arange(w.shape[0], device=w.codes.device))
    if isinstance(w, Int8Weight):
        return w.qweight.float() * w.scale[:, None]
    assert isinstance(w, Fp8Weight)
    return fp8.dequantize(w)


@pytest.mark.parametrize("fmt", list(FOLDERS))
def test_a_tiny_llama_folder_round_trips(fmt, tiny_model, tmp_path):
    config, pack, dequantize = FOLDERS[fmt]
    folder = qp.quantized_folder(tiny_model, tmp_path / fmt, config, pack)
    hf_config = json.loads((folder / "config.json").read_text())
    s = scheme(hf_config)
    assert isinstance(s, QuantizationScheme)
    raw = read_weights(folder, torch.bfloat16, "cpu", LoadTimings(), keep=keep_dtype(s))
    out = gather(raw, s, torch.bfloat16)
    stored = load_file(str(folder / "model.safetensors"))
    original = load_file(str(tiny_model / "model.safetensors"))
    linears = [n for n in original if n.rsplit(".", 2)[-2] in qp.LINEARS]
    assert linears and set(out) == set(original)
    for name in linears:
        prefix = name[:-len(".weight")]
        parts = {n[len(prefix) + 1:]: t for n, t in stored.items() if n.startswith(prefix + ".")}
        assert torch.equal(values(out[name]), dequantize(parts)), name
        assert (values(out[name]) - original[name]).abs().max() < 0.05, name     # and near the floats
    for name in set(original) - set(linears):
        assert out[name].dtype == torch.bfloat16
        assert torch.equal(out[name], original[name].to(torch.bfloat16)), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the staged loader runs only there")
@pytest.mark.parametrize("fmt", list(FOLDERS))
def test_gathered_on_the_gpu_is_gathered_on_the_cpu(fmt, tiny_model, tmp_path):
    config, pack, _ = FOLDERS[fmt]
    folder = qp.quantized_folder(tiny_model, tmp_path / fmt, config, pack)
    s = scheme(json.loads((folder / "config.json").read_text()))
    assert s is not None
    on = {device: gather(read_weights(folder, torch.bfloat16, device, LoadTimings(), keep=keep_dtype(s)), s,
                         torch.bfloat16) for device in ("cpu", "cuda")}
    for name, w in on["cpu"].items():
        gpu = on["cuda"][name]
        if isinstance(w, torch.Tensor):
            assert isinstance(gpu, torch.Tensor) and torch.equal(gpu.cpu(), w), name
        else:
            assert type(gpu) is type(w) and torch.equal(values(gpu).cpu(), values(w)), name


# -- served: the engine's kernels on the quantized weights, transformers on their values --

@pytest.mark.parametrize("fmt", list(FOLDERS))
def test_served_greedy_equals_transformers_on_the_dequantized_weights(fmt, tiny_model, hf_oracle, tmp_path):
    import random

    from safetensors.torch import save_file

    from runtime import LLM, SamplingParams
    from tests.runtime.conftest import hf_greedy

    config, pack, _ = FOLDERS[fmt]
    folder = qp.quantized_folder(tiny_model, tmp_path / fmt, config, pack)
    s = scheme(json.loads((folder / "config.json").read_text()))
    assert s is not None
    raw = read_weights(folder, torch.float32, "cpu", LoadTimings(), keep=keep_dtype(s))
    oracle = tmp_path / f"{fmt}-oracle"
    oracle.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (oracle / name).write_text((tiny_model / name).read_text())
    save_file({n: (w if isinstance(w, torch.Tensor) else values(w)).float().contiguous()
               for n, w in gather(raw, s, torch.float32).items()}, str(oracle / "model.safetensors"))
    prompt = [random.Random(7).randrange(5, 250) for _ in range(17)]
    expected, _ = hf_greedy(hf_oracle(oracle), prompt, 16)
    llm = LLM(str(folder), kv_cache_tokens=256)
    layer = llm.engine.runner.model.layers[0]
    assert not isinstance(layer.qkv, torch.Tensor) or fmt == "fp8"       # kept quantized (fp8: widened on a CPU)
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert out.token_ids == expected


def test_gptq_act_order_parts_of_one_input_fuse():
    """q, k and v share their input and so their g_idx: one weight, its order kept."""
    from runtime.load.quantization import stack_rows

    config = gptq_config(32, True, False)
    parts = [gathered(qp.gptq_pack(weight(seed=i), 32, True, False, seed=0), config) for i in range(3)]
    fused = stack_rows(parts)
    assert isinstance(fused, GroupQuantized) and torch.equal(fused.input_order, parts[0].input_order)
    x = torch.randn(3, K)
    assert torch.allclose(group_quant.linear_ref(x, fused), torch.cat([group_quant.linear_ref(x, p) for p in parts], 1))
