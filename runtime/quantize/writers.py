"""Quantized linears written as a Hugging Face quantized folder, in the packing the
reference tools write (and spec/quantization_config.py + runtime/load/hf_quantized.py read):

- GPTQ v1 (AutoGPTQ's QuantLinear.pack): qweight [K/8, N] int32, nibble i of row r
  holding input k = 8r + i; qzeros [G, N/8] int32 holding zero - 1, nibble i of column c
  holding channel 8c + i; scales [G, N] float16; g_idx [K] int32.
- AWQ GEMM (AutoAWQ's WQLinear_GEMM.from_linear): qweight [K, N/8] int32 and qzeros
  [G, N/8] int32, nibble i of column c holding channel 8c + AWQ_ORDER[i]; scales [G, N]
  float16.

config.json gets the quantization_config each tool writes; every other tensor of the
model (embedding, norms, head) is stored as float32, and the tokenizer and generation
files are copied.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from runtime.quantize.groups import QuantizedLinear

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
NIBBLES = 8
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "config.json")


def gptq_config(group: int, desc_act: bool, sym: bool, damp: float, true_sequential: bool) -> dict[str, Any]:
    """What AutoGPTQ writes (BaseQuantizeConfig.to_dict with quant_method and checkpoint_format)."""
    return {"bits": 4, "group_size": group, "damp_percent": damp, "desc_act": desc_act, "static_groups": False,
            "sym": sym, "true_sequential": true_sequential, "model_name_or_path": None,
            "model_file_base_name": "model", "quant_method": "gptq", "checkpoint_format": "gptq"}


def awq_config(group: int) -> dict[str, Any]:
    """What AutoAWQ writes."""
    return {"quant_method": "awq", "zero_point": True, "group_size": group, "bits": 4, "version": "gemm",
            "modules_to_not_convert": None}


def pack_gptq(q: QuantizedLinear) -> dict[str, torch.Tensor]:
    return {"qweight": _packed(q.codes).T.contiguous(), "qzeros": _packed(((q.zeros - 1) & 0xF).T),
            "scales": q.scales.T.contiguous(), "g_idx": q.g_idx.to(torch.int32)}


def pack_awq(q: QuantizedLinear) -> dict[str, torch.Tensor]:
    if not torch.equal(q.g_idx, torch.arange(q.codes.shape[1]) // q.group):
        raise ValueError("AWQ stores groups of consecutive input columns only (no g_idx)")
    return {"qweight": _packed(_awq_ordered(q.codes.T)), "qzeros": _packed(_awq_ordered(q.zeros.T)),
            "scales": q.scales.T.contiguous()}


def _awq_ordered(values: torch.Tensor) -> torch.Tensor:
    """[R, C] -> [R, C], each run of 8 columns reordered so that place i holds column AWQ_ORDER[i]."""
    r, c = values.shape
    return values.reshape(r, c // NIBBLES, NIBBLES)[..., list(AWQ_ORDER)].reshape(r, c)


def _packed(values: torch.Tensor) -> torch.Tensor:
    """int [R, C] 0..15 -> int32 [R, C/8]: each 8 consecutive values in one, the first
    in the lowest bits."""
    r, c = values.shape
    nibbles = values.to(torch.int64).reshape(r, c // NIBBLES, NIBBLES)
    packed = (nibbles << (4 * torch.arange(NIBBLES, dtype=torch.int64))).sum(dim=-1)
    return ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)      # the uint32 bits as int32


def write_folder(source: Path, out: Path, tensors: dict[str, torch.Tensor], linears: dict[str, QuantizedLinear],
                 fmt: str, config: dict[str, Any]) -> Path:
    """The folder `out`: `tensors` but the weights of `linears` (by name without .weight),
    which are stored packed in `fmt` ("gptq" or "awq"), with `config` as config.json's
    quantization_config; the source folder's other files copied."""
    pack = {"gptq": pack_gptq, "awq": pack_awq}[fmt]
    out.mkdir(parents=True, exist_ok=True)
    stored: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and name[:-len(".weight")] in linears:
            continue
        stored[name] = t.float().contiguous()
    for prefix, q in linears.items():
        stored.update({f"{prefix}.{part}": t.contiguous() for part, t in pack(q).items()})
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config = json.loads((source / "config.json").read_text())
    hf_config["quantization_config"] = config
    hf_config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    if fmt == "gptq":
        (out / "quantize_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in source.iterdir():
        if path.is_file() and not path.name.startswith(".") and path.name not in WEIGHT_FILES \
                and not path.name.endswith(".safetensors"):
            shutil.copy2(path, out / path.name)
    return out
