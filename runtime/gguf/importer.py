"""Import a GGUF file into a model folder: `import_gguf(FILE.gguf, OUT_DIR)`.

What DESIGN.md calls a model folder comes out: config.json and generation_config.json
from the metadata (spec/gguf_model.py, which also checks every tensor's name and shape
before any is read), model.safetensors with every tensor renamed to the Hugging Face
layout, with llama.cpp's reordering of q/k rows for its rotary layout undone, and
tokenizer.json / tokenizer_config.json (chat template, BOS/EOS) from the vocabulary
(runtime/gguf/tokenizer.py). Llama 3 rope scaling, which llama.cpp stores as a
`rope_freqs` tensor, goes back into config.json.

The quantized types the engine has kernels for (runtime/gguf/repack.py: Q4_0, Q4_1,
Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0) stay quantized: tensor NAME is written as
NAME.codes, NAME.scales and, as the type has them, NAME.offsets, NAME.scale_super,
NAME.offset_super (kernels/group_quant.py's fields), and config.json's
quantization_config ({"quant_method": "gguf"}) lists each with its type, bits, group
and super_every, and the tensors of other types, which are dequantized (gguf.quants:
the IQ types, Q2_K, Q3_K) into the folder's dtype, as `widened`. With dequantize=True
every tensor is dequantized (a folder transformers reads).

Tensors are read memory-mapped and written one at a time, so memory stays at the
largest tensor. Every refusal is a `GGUFError` naming the field or tensor.
Also a command: `python -m runtime.gguf.importer FILE.gguf OUT_DIR` (what the pool runs
on a node) and `thawpool models import FILE.gguf OUT_DIR`.
"""
from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from runtime.gguf.repack import q4_0_offsets_fit, repack
from spec.gguf import GGUFError, GGUFHeader, TensorInfo, parse_header
from spec.gguf_layouts import LAYOUTS, kept_quantized, widened
from spec.gguf_model import architecture, describe, stop_token_ids

OUT_DTYPES = {"float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2)}


@dataclass(frozen=True)
class Planned:
    hf_name: str
    info: TensorInfo
    unpermute_heads: Optional[int]          # llama.cpp's q/k row order over this many heads
    kept: bool = False                      # stays quantized (repack), else dequantized


def read_file_header(path: str | Path) -> GGUFHeader:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return parse_header(b"", 0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return parse_header(mapped, size)


def import_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32",
                dequantize: bool = False) -> Path:
    """Write the model folder for `gguf_path` into `out_dir` (created); returns it."""
    from runtime.gguf.tokenizer import build_tokenizer
    from runtime.gguf.tokenizer_file import save_tokenizer

    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(OUT_DTYPES)}")
    header = read_file_header(gguf_path)
    config, named = describe(header)
    heads = _qk_heads(config) if architecture(header.metadata).permute_qk else {}
    plan = [Planned(name, info, heads.get(name.rsplit(".", 2)[-2]),
                    kept=not dequantize and kept_quantized(info))
            for name, info in named]
    data = np.memmap(gguf_path, dtype=np.uint8, mode="r", offset=header.data_offset)
    rope_freqs = header.tensor("rope_freqs.weight")
    if rope_freqs is not None:
        config["rope_scaling"] = llama3_scaling(dequantized(data, rope_freqs), config)
    tokenizer, tokenizer_config = build_tokenizer(header.metadata)
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        write_safetensors(out / "model.safetensors", plan, data, dtype)
    except BaseException:
        (out / "model.safetensors").unlink(missing_ok=True)       # no half-written weights left
        raise
    config["torch_dtype"] = dtype
    if any(item.kept for item in plan):
        config["quantization_config"] = quantization_config(plan)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", _generation_config(header.metadata, config))
    save_tokenizer(tokenizer, out / "tokenizer.json")
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    return out


def _qk_heads(config: dict[str, Any]) -> dict[str, int]:
    """Heads llama.cpp permuted the rows over, by projection."""
    return {"q_proj": int(config["num_attention_heads"]), "k_proj": int(config["num_key_value_heads"])}


def dequantized(data: np.ndarray, info: TensorInfo) -> np.ndarray:
    """The tensor as float32 in its row-major shape."""
    import gguf.quants

    raw = _rows(data, info)
    if info.type_name == "F32":
        out = raw.view(np.float32)
    elif info.type_name == "F16":
        out = raw.view(np.float16).astype(np.float32)
    else:
        try:
            out = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(info.ggml_type))
        except NotImplementedError:
            raise GGUFError(f"tensor {info.name}: type {info.type_name} cannot be dequantized") from None
    return np.asarray(out, dtype=np.float32).reshape(info.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's convert_hf_to_gguf `permute`: within each head it interleaved the
    two rotary halves of the rows ([h, 2, d/2] -> [h, d/2, 2]); put them back."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quantization_config(plan: list[Planned]) -> dict[str, Any]:
    """config.json's record of what stayed quantized (the loader rebuilds each weight
    from it, runtime/load/checkpoint_formats.py) and what was widened."""
    weights = {}
    for item in plan:
        if item.kept:
            layout = LAYOUTS[item.info.type_name]
            weights[item.hf_name] = {"type": item.info.type_name, "bits": layout.bits, "group": layout.group,
                                     "super_every": layout.super_every}
    wide = [item.hf_name for item in plan if not item.kept and widened(item.info)]
    return {"quant_method": "gguf", "weights": weights, "widened": wide}


def tensors(plan: list[Planned], data: np.ndarray, dtype: str) -> Iterator[tuple[str, np.ndarray]]:
    """(safetensors name, array to write) in plan order; a kept tensor gives one per part."""
    for item in plan:
        if item.kept:
            repacked = repack(_rows(data, item.info), item.info.type_name)
            if item.unpermute_heads:
                repacked = repacked.rows(_unpermuted_order(item.info.shape[0], item.unpermute_heads))
            for part, array in repacked.arrays().items():
                if not np.isfinite(array).all():
                    raise GGUFError(f"tensor {item.info.name}: holds values that are not finite")
                yield f"{item.hf_name}.{part}", array
            continue
        w = dequantized(data, item.info)
        if item.unpermute_heads:
            w = unpermute(w, item.unpermute_heads)
        if not np.isfinite(w).all():
            raise GGUFError(f"tensor {item.info.name}: holds values that are not finite")
        yield item.hf_name, _cast(w, dtype)


def _rows(data: np.ndarray, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as rows (of ggml blocks for a quantized type)."""
    raw = data[info.offset:info.offset + info.nbytes]
    rows = info.num_elements // info.shape[-1]
    return raw.reshape(rows, info.nbytes // rows)


def _unpermuted_order(rows: int, heads: int) -> np.ndarray:
    """The row order `unpermute` puts rows in, as indices."""
    return unpermute(np.arange(rows)[:, None], heads)[:, 0]


def entry_layout(item: Planned, data: np.ndarray, dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of what `tensors` writes for item, known before
    its data is repacked (only Q4_0's offsets read their block scales first)."""
    if not item.kept:
        return [(item.hf_name, OUT_DTYPES[dtype][0], item.info.shape)]
    rows, cols = item.info.shape
    layout = LAYOUTS[item.info.type_name]
    groups = cols // layout.group
    parts = [("codes", "U8" if layout.bits == 4 else "I8", (rows, cols * layout.bits // 8)),
             ("scales", "F16", (rows, groups))]
    if layout.offsets:
        wide = item.info.type_name == "Q4_0" and not q4_0_offsets_fit(_rows(data, item.info))
        parts.append(("offsets", "F32" if wide else "F16", (rows, groups)))
    if layout.super_every > 1:
        parts.append(("scale_super", "F16", (rows, groups // layout.super_every)))
        if layout.offsets:
            parts.append(("offset_super", "F16", (rows, groups // layout.super_every)))
    return [(f"{item.hf_name}.{part}", code, shape) for part, code, shape in parts]


SAFETENSORS_WIDTHS = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I8": 1}


def write_safetensors(path: Path, plan: list[Planned], data: np.ndarray, dtype: str) -> None:
    """One tensor at a time: the header is known from the plan before any data is read."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for item in plan:
        for name, code, shape in entry_layout(item, data, dtype):
            nbytes = math.prod(shape) * SAFETENSORS_WIDTHS[code]
            entries[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
    head = json.dumps(entries, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, array in tensors(plan, data, dtype):
            expected = entries[name]
            if list(array.shape) != expected["shape"] or array.nbytes != (expected["data_offsets"][1]
                                                                         - expected["data_offsets"][0]):
                raise AssertionError(f"{name}: repacked as {array.dtype} {array.shape}, planned {expected}")
            f.write(np.ascontiguousarray(array).tobytes())


def _cast(w: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return w
    if dtype == "float16":
        return w.astype(np.float16)
    bits = w.astype(np.float32).view(np.uint32).astype(np.uint64)    # bfloat16: round to nearest even
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


LLAMA3_LOW_HIGH = (1.0, 4.0)        # low_freq_factor, high_freq_factor of every Llama 3.x release


def llama3_scaling(factors: np.ndarray, config: dict[str, Any]) -> dict[str, Any]:
    """The rope_scaling whose per-frequency factors llama.cpp stored as rope_freqs."""
    factor = float(factors.max())
    low, high = LLAMA3_LOW_HIGH
    for original in (2 ** k for k in range(6, 21)):
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                   "high_freq_factor": high, "original_max_position_embeddings": original}
        if np.allclose(llama3_factors(scaling, config), factors, rtol=1e-4):
            return scaling
    raise GGUFError("tensor rope_freqs.weight: the frequency factors are not Llama 3 rope scaling")


def llama3_factors(s: dict[str, Any], config: dict[str, Any]) -> np.ndarray:
    """What llama.cpp's converter computes from a Llama 3 rope_scaling (divisors per frequency)."""
    dim = config["head_dim"]
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    original = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / s["low_freq_factor"], original / s["high_freq_factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s["factor"])
        else:
            smooth = (original / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def _generation_config(meta: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"bos_token_id": config.get("bos_token_id")}
    stops = stop_token_ids(meta)
    if stops:
        out["eos_token_id"] = stops if len(stops) > 1 else stops[0]
    return out


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command line's arguments (`thawpool models import` runs this module with them)."""
    p.add_argument("gguf", type=Path, help="the .gguf file")
    p.add_argument("out_dir", type=Path, help="the model folder to write (created)")
    p.add_argument("--dtype", default="float32", choices=sorted(OUT_DTYPES),
                   help="of the weights written unquantized (default float32: the dequantized values exactly)")
    p.add_argument("--dequantize", action="store_true",
                   help="dequantize every tensor (a folder transformers reads), not only the types "
                        "the engine has no kernel for")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        out = import_gguf(args.gguf, args.out_dir, dtype=args.dtype, dequantize=args.dequantize)
    except (GGUFError, OSError) as exc:
        print(f"{args.gguf}: {exc}", file=sys.stderr)
        return 2
    print(f"imported {args.gguf} into {out} in {time.monotonic() - started:.1f}s")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.gguf.importer", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
