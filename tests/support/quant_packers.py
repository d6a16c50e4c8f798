"""Quantized checkpoint tensors made from float weights by each format's documented
packing, and each format's own dequantization, for tests.

A packer takes w: [N, K] float (N output channels) and returns the tensors a checkpoint
stores for that linear, by the last part of their names (P.qweight, ...). The
dequantizers follow the reference implementations step for step (AutoAWQ's
dequantize_gemm, GPTQModel's dequantize_weight, compressed-tensors' unpack_from_int32 and
dequantize), computed in float32, and return [N, K]. Packing is done in int64 and
wrapped to int32 at the end, as numpy's uint32 packing and its view as int32 do.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
SHIFTS = torch.arange(0, 32, 4)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _to_int32(packed: torch.Tensor) -> torch.Tensor:
    """int64 holding an unsigned 32-bit pattern -> the int32 with those bits."""
    return ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)


def _asym_groups(w: torch.Tensor, group: int, qmax: int = 15, min_zero: int = 0):
    """Per group of `group` columns: scale (float16) and integer zero, min-max (AWQ, GPTQ)."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo = g.amin(-1).clamp(max=0)
    hi = g.amax(-1).clamp(min=0)
    scale = ((hi - lo).clamp(min=1e-5) / qmax).half()
    zero = torch.round(-lo / scale.float()).clamp(min_zero, qmax).to(torch.int64)
    return scale, zero                                    # [N, G] each


def _codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_of: torch.Tensor) -> torch.Tensor:
    """[N, K] int64 codes 0..15: round(w / s) + z of each column's group."""
    s = scale.float()[:, group_of]
    return (torch.round(w / s) + zero[:, group_of]).clamp(0, 15).to(torch.int64)


# -- AWQ (GEMM) -------------------------------------------------------------------------

def awq_pack(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """AutoAWQ's WQLinear_GEMM.from_linear: qweight [K, N/8], qzeros [K/g, N/8], scales [K/g, N]."""
    n, k = w.shape
    scale, zero = _asym_groups(w, group)
    q = _codes(w, scale, zero, torch.arange(k) // group)
    return {"qweight": _awq_pack_columns(q.T), "qzeros": _awq_pack_columns(zero.T), "scales": scale.T.contiguous()}


def _awq_pack_columns(values: torch.Tensor) -> torch.Tensor:
    packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for col in range(values.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= values[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    return _to_int32(packed)


def awq_dequantize(t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    def unpack(packed: torch.Tensor) -> torch.Tensor:
        values = torch.bitwise_right_shift(packed[:, :, None], SHIFTS[None, None, :].to(torch.int32)).to(torch.int8)
        values = values.view(values.shape[0], -1)
        order = torch.arange(values.shape[-1]).view(-1, 8)[:, AWQ_REVERSE_ORDER].view(-1)
        return torch.bitwise_and(values[:, order], 15)
    iweight, izeros = unpack(t["qweight"]), unpack(t["qzeros"])
    scales = t["scales"].float().repeat_interleave(group, dim=0)
    izeros = izeros.repeat_interleave(group, dim=0)
    return ((iweight - izeros).float() * scales).T                    # [N, K]


# -- GPTQ (v1 checkpoints) --------------------------------------------------------------

def gptq_pack(w: torch.Tensor, group: Optional[int], desc_act: bool, sym: bool,
              seed: int = 0) -> dict[str, torch.Tensor]:
    """AutoGPTQ's QuantLinear.pack: qweight [K/8, N], qzeros [G, N/8] holding zero - 1,
    scales [G, N] float16, g_idx [K]. desc_act: groups are taken along a permutation of K
    (the act order), so g_idx is not k // group. group None: one group per row. Zeros are
    kept at 1..15: a zero of 0 has no v1 encoding (AutoGPTQ's packer spills its -1)."""
    n, k = w.shape
    group = group or k
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if desc_act else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[order] = torch.arange(k) // group
    permuted = w[:, order]                                  # the groups are contiguous here
    if sym:
        half = permuted.reshape(n, k // group, group).abs().amax(-1).clamp(min=1e-5)
        scale = (2 * half / 15).half()
        zero = torch.full_like(scale, 8, dtype=torch.int64)
    else:
        scale, zero = _asym_groups(permuted, group, min_zero=1)
    q = _codes(w, scale, zero, g_idx)                       # [N, K]
    qweight = torch.zeros(k // 8, n, dtype=torch.int64)
    for i in range(8):
        qweight |= q.T[i::8] << (4 * i)
    stored = (zero.T - 1) & 0xF                             # [G, N]
    qzeros = torch.zeros(stored.shape[0], n // 8, dtype=torch.int64)
    for i in range(8):
        qzeros |= stored[:, i::8] << (4 * i)
    return {"qweight": _to_int32(qweight), "qzeros": _to_int32(qzeros), "scales": scale.T.contiguous(),
            "g_idx": g_idx.to(torch.int32)}


def gptq_dequantize(t: dict[str, torch.Tensor]) -> torch.Tensor:
    wf = SHIFTS.to(torch.int32).unsqueeze(0)
    qzeros, qweight, scales = t["qzeros"], t["qweight"], t["scales"]
    zeros = torch.bitwise_right_shift(qzeros.unsqueeze(2).expand(-1, -1, 8), wf.unsqueeze(0)).to(torch.int8)
    zeros = (torch.bitwise_and(zeros, 15) + 1).reshape(scales.shape)     # v1: stored zero - 1
    weight = torch.bitwise_right_shift(qweight.unsqueeze(1).expand(-1, 8, -1), wf.unsqueeze(-1)).to(torch.int8)
    weight = torch.bitwise_and(weight, 15).reshape(-1, weight.shape[2])
    g_idx = t["g_idx"].long()
    return (scales.float()[g_idx] * (weight - zeros[g_idx]).float()).T   # [N, K]


# -- compressed-tensors -----------------------------------------------------------------

def pack_to_int32(value: torch.Tensor, packed_dim: int = 1) -> torch.Tensor:
    """compressed-tensors' pack_to_int32, 4 bits: value + 8, eight to an int32 along dim."""
    unsigned = (value.to(torch.int64) + 8) & 0xFF
    if packed_dim == 0:
        return pack_to_int32(value.T, 1).T.contiguous()
    n, k = unsigned.shape
    pad = -k % 8
    unsigned = torch.nn.functional.pad(unsigned, (0, pad))
    packed = torch.zeros(n, (k + pad) // 8, dtype=torch.int64)
    for i in range(8):
        packed |= unsigned[:, i::8] << (4 * i)
    return _to_int32(packed)


def unpack_from_int32(value: torch.Tensor, shape: tuple[int, int], packed_dim: int = 1) -> torch.Tensor:
    if packed_dim == 0:
        return unpack_from_int32(value.T.contiguous(), (shape[1], shape[0]), 1).T
    unpacked = torch.zeros(value.shape[0], value.shape[1] * 8, dtype=torch.int32)
    for i in range(8):
        unpacked[:, i::8] = (value >> (4 * i)) & 15
    return (unpacked[:, :shape[1]] - 8).to(torch.int8)


def ct_pack(w: torch.Tensor, group: Optional[int], sym: bool, scale_dtype: torch.dtype,
            actorder: bool = False, zero_packed: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized W4A16 (strategy group, or channel when group is
    None): weight_packed [N, K/8], weight_scale [N, G], weight_zero_point packed along N
    (asymmetric; or int8 [N, G] as older versions stored it), weight_shape, weight_g_idx
    (actorder "group")."""
    n, k = w.shape
    group = group or k
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if actorder else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[order] = torch.arange(k) // group
    g = w[:, order].reshape(n, k // group, group)
    if sym:
        scale = (g.abs().amax(-1).clamp(min=1e-5) / 7.5).to(scale_dtype)
        zp = torch.zeros_like(scale, dtype=torch.int64)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo).clamp(min=1e-5) / 15).to(scale_dtype)
        zp = torch.round(-8 - lo / scale.float()).clamp(-8, 7).to(torch.int64)
    s = scale.float()[:, g_idx]
    q = (torch.round(w / s) + zp[:, g_idx]).clamp(-8, 7).to(torch.int8)
    out = {"weight_packed": pack_to_int32(q), "weight_scale": scale, "weight_shape": torch.tensor([n, k])}
    if not sym:
        out["weight_zero_point"] = pack_to_int32(zp.to(torch.int8), packed_dim=0) if zero_packed else zp.to(torch.int8)
    if actorder:
        out["weight_g_idx"] = g_idx.to(torch.int32)
    return out


def ct_dequantize(t: dict[str, torch.Tensor]) -> torch.Tensor:
    n, k = (int(v) for v in t["weight_shape"])
    q = unpack_from_int32(t["weight_packed"], (n, k))
    scale = t["weight_scale"]
    zp = t.get("weight_zero_point")
    if zp is not None and zp.dtype == torch.int32:
        zp = unpack_from_int32(zp, (n, scale.shape[1]), packed_dim=0)
    g_idx = t.get("weight_g_idx")
    group_of = g_idx.long() if g_idx is not None else torch.arange(k) // (k // scale.shape[1])
    value = q.float()
    if zp is not None:
        value = value - zp.float()[:, group_of]
    return value * scale.float()[:, group_of]


def int8_pack(w: torch.Tensor, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """compressed-tensors int-quantized, symmetric per channel: weight int8, weight_scale [N, 1]."""
    scale = (w.abs().amax(1, keepdim=True).clamp(min=1e-5) / 127).to(scale_dtype)
    q = torch.round(w / scale.float()).clamp(-128, 127).to(torch.int8)
    return {"weight": q, "weight_scale": scale}


def int8_dequantize(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return t["weight"].float() * t["weight_scale"].float()


def fp8_pack(w: torch.Tensor, per_channel: bool) -> dict[str, torch.Tensor]:
    """FP8 e4m3 with a float32 scale per tensor ([]) or per channel ([N, 1])."""
    amax = w.abs().amax(1, keepdim=True) if per_channel else w.abs().amax()
    scale = (amax.clamp(min=1e-8) / 448).float()
    return {"weight": (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn), "weight_scale": scale}


def fp8_dequantize(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return t["weight"].float() * t["weight_scale"].float()


# -- a model folder ----------------------------------------------------------------------

def quantized_folder(source: Path, folder: Path, config: dict,
                     pack: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> Path:
    """The model folder at `source` with its decoder linears stored by `pack`."""
    shutil.copytree(source, folder)
    tensors = load_file(str(source / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.rsplit(".", 2)[-2] in LINEARS:
            prefix = name[:-len(".weight")]
            out.update({f"{prefix}.{part}": v.contiguous() for part, v in pack(t.float()).items()})
        else:
            out[name] = t
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    hf_config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(hf_config | {"quantization_config": config}))
    return folder
