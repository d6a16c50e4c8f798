"""Which Hugging Face `quantization_config`s the runtime serves (no torch: the pool reads
it at deploy to refuse the others and to size the loaded weights; the runtime's loader,
runtime/load/hf_quantized.py, repacks the checkpoint's tensors by it).

Served, each repacked at load into a layout the engine's kernels read:
- 4-bit integer weights with a scale (and a zero point) per group of 32, 64 or 128
  input values, or per output channel: AWQ (GEMM packing), GPTQ (v1 checkpoints, with or
  without desc_act), compressed-tensors "pack-quantized" (W4A16);
- int8 weights per output channel with activations quantized per token at run time:
  compressed-tensors "int-quantized" (W8A8), what the engine's own int8 path runs;
- FP8 e4m3 weights with a scale per tensor or per output channel, activations dynamic:
  quant_method "fp8", compressed-tensors "float-quantized".

Anything else is a ValueError whose message starts with the path of the field that is
not served, e.g. `quantization_config.bits: 3 is not supported (4)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

ROOT = "quantization_config"
GROUP_SIZES = (32, 64, 128)
METHODS = ("awq", "gptq", "compressed-tensors", "fp8")
INT4, INT8, FP8 = "int4", "int8", "fp8"
# The checkpoint tensors of one quantized linear `P`, by the last part of their name
# (P.<part>); the float ones among them keep their stored dtype as they load.
PARTS = {
    "awq": ("qweight", "qzeros", "scales"),
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
    "pack-quantized": ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape"),
    "int-quantized": ("weight", "weight_scale", "weight_zero_point"),
    "float-quantized": ("weight", "weight_scale", "input_scale"),
    "fp8": ("weight", "weight_scale", "input_scale"),
}
FLOAT_PARTS = frozenset({"scales", "weight_scale", "weight_zero_point", "input_scale"})
BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
         "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class QuantizationScheme:
    method: str                        # quant_method: one of METHODS
    weights: str                       # INT4 (group-wise), INT8 (per channel) or FP8
    layout: str                        # the checkpoint's tensors: a key of PARTS
    group_size: Optional[int] = None   # INT4: input values per group; None: one per row
    symmetric: bool = True
    act_order: bool = False            # a g_idx may put K's columns in any group


def scheme(config: Mapping[str, Any]) -> Optional[QuantizationScheme]:
    """config.json's quantization_config read; None when there is none. ValueError naming
    the first field the runtime cannot serve."""
    q = config.get(ROOT)
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise ValueError(f"{ROOT}: must be an object")
    method = q.get("quant_method")
    if method == "awq":
        return _awq(q)
    if method == "gptq":
        return _gptq(q)
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "fp8":
        return _fp8(q)
    raise ValueError(_refusal(f"{ROOT}.quant_method", method, ", ".join(METHODS)))


def is_part(s: QuantizationScheme, name: str) -> bool:
    """Whether checkpoint tensor `name` is one of the tensors of a quantized linear under
    this scheme (a plain `.weight` is only when stored as integers or FP8: see loaded_bytes)."""
    return name.rsplit(".", 1)[-1] in PARTS[s.layout]


def keeps_dtype(s: QuantizationScheme, name: str) -> bool:
    """Whether float tensor `name` keeps its stored dtype as it loads: the scales and zero
    points of quantized weights (the engine's dtype could round them)."""
    return name.rsplit(".", 1)[-1] in FLOAT_PARTS and is_part(s, name)


def loaded_bytes(s: QuantizationScheme, name: str, dtype: str, shape: Sequence[int]) -> Optional[int]:
    """The bytes the tensor takes once repacked into the engine's layouts, at most; None
    when it is not part of a quantized weight (it loads at the engine's dtype).

    dtype: the safetensors name ("I32", "BF16", ...)."""
    part = name.rsplit(".", 1)[-1]
    if not is_part(s, name) or (part == "weight" and dtype not in ("I8", "F8_E4M3")):
        return None
    count = 1
    for d in shape:
        count *= int(d)
    stored = count * BYTES.get(dtype, 4)
    if part in ("qzeros", "weight_zero_point"):
        # zero points become a float offset per group: float32 where float16 is not exact
        return count * (8 if dtype == "I32" else 1) * 4
    if part in ("g_idx", "weight_g_idx"):
        return count * 8                       # the int64 order of the input's columns
    if part == "weight_shape":
        return 0
    if part in ("scales", "weight_scale") and s.weights == INT4:
        # a symmetric format has no zero points stored but an offset per group all the same
        width = 4 if dtype not in ("F16", "F32") else BYTES[dtype]
        return count * width * (2 if s.symmetric and s.layout == "pack-quantized" else 1)
    if part in ("weight_scale", "input_scale"):
        return count * 4                       # float32
    return stored


def _refusal(path: str, value: Any, served: str) -> str:
    return f"{path}: {value!r} is not supported ({served})"


def _expect(q: Mapping[str, Any], path: str, key: str, default: Any, served: Sequence[Any]) -> Any:
    value = q.get(key, default)
    # bool is an int to Python: True must not pass for 1
    if type(value) not in {type(v) for v in served} or value not in served:
        raise ValueError(_refusal(f"{path}.{key}", value, " or ".join(_spelled(v) for v in served)))
    return value


def _spelled(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def _awq(q: Mapping[str, Any]) -> QuantizationScheme:
    _expect(q, ROOT, "bits", None, (4,))
    group = _expect(q, ROOT, "group_size", None, GROUP_SIZES)
    version = q.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise ValueError(_refusal(f"{ROOT}.version", version, "gemm"))
    zero_point = _expect(q, ROOT, "zero_point", True, (True, False))
    # GEMM checkpoints store qzeros either way (AutoAWQ's and vLLM's kernels always read them)
    return QuantizationScheme("awq", INT4, "awq", group_size=group, symmetric=not zero_point)


def _gptq(q: Mapping[str, Any]) -> QuantizationScheme:
    _expect(q, ROOT, "bits", None, (4,))
    group = _expect(q, ROOT, "group_size", None, (*GROUP_SIZES, -1))
    desc_act = _expect(q, ROOT, "desc_act", False, (True, False))
    sym = _expect(q, ROOT, "sym", True, (True, False))
    _expect(q, ROOT, "checkpoint_format", "gptq", ("gptq",))
    _expect(q, ROOT, "is_marlin_format", False, (False,))
    _expect(q, ROOT, "pack_dtype", "int32", ("int32",))
    return QuantizationScheme("gptq", INT4, "gptq", group_size=None if group == -1 else group,
                              symmetric=sym, act_order=desc_act)


def _fp8(q: Mapping[str, Any]) -> QuantizationScheme:
    _expect(q, ROOT, "activation_scheme", "dynamic", ("dynamic",))
    _expect(q, ROOT, "fmt", "e4m3", ("e4m3",))
    _expect(q, ROOT, "weight_block_size", None, (None,))
    return QuantizationScheme("fp8", FP8, "fp8")


def _compressed_tensors(q: Mapping[str, Any]) -> QuantizationScheme:
    _expect(q, ROOT, "quantization_status", "compressed", ("compressed",))
    for key in ("sparsity_config", "transform_config"):
        extra = q.get(key)
        if extra and (not isinstance(extra, Mapping) or extra.get("format", "dense") != "dense"):
            raise ValueError(f"{ROOT}.{key}: not supported (none)")
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        count = len(groups) if isinstance(groups, Mapping) else groups
        raise ValueError(_refusal(f"{ROOT}.config_groups", count, "one group"))
    (name, group), = groups.items()
    path = f"{ROOT}.config_groups.{name}"
    if not isinstance(group, Mapping):
        raise ValueError(f"{path}: must be an object")
    fmt = group.get("format") or q.get("format")
    where = f"{path}.format" if group.get("format") else f"{ROOT}.format"
    if fmt == "pack-quantized":
        return _pack_quantized(group, path)
    if fmt == "int-quantized":
        return _int_quantized(group, path)
    if fmt == "float-quantized":
        return _float_quantized(group, path)
    raise ValueError(_refusal(where, fmt, "pack-quantized, int-quantized or float-quantized"))


def _arguments(group: Mapping[str, Any], path: str, key: str) -> Mapping[str, Any]:
    args = group.get(key)
    if not isinstance(args, Mapping):
        raise ValueError(f"{path}.{key}: must be an object")
    return args


def _pack_quantized(group: Mapping[str, Any], path: str) -> QuantizationScheme:
    w = _arguments(group, path, "weights")
    wp = f"{path}.weights"
    _expect(w, wp, "num_bits", None, (4,))
    _expect(w, wp, "type", "int", ("int",))
    _expect(w, wp, "dynamic", False, (False,))
    strategy = _expect(w, wp, "strategy", None, ("group", "channel"))
    size = _expect(w, wp, "group_size", None, GROUP_SIZES) if strategy == "group" else None
    sym = _expect(w, wp, "symmetric", True, (True, False))
    actorder = _expect(w, wp, "actorder", None, (None, False, True, "group", "weight", "static"))
    _expect(group, path, "input_activations", None, (None,))
    return QuantizationScheme("compressed-tensors", INT4, "pack-quantized", group_size=size, symmetric=sym,
                              act_order=actorder in (True, "group"))


# the 8-bit schemes, field by field: (default when absent, the values served)
_INT8_WEIGHTS = {"num_bits": (None, (8,)), "type": ("int", ("int",)), "symmetric": (True, (True,)),
                 "strategy": (None, ("channel", "tensor")), "dynamic": (False, (False,))}
_INT8_ACTIVATIONS = {"num_bits": (None, (8,)), "type": ("int", ("int",)), "symmetric": (True, (True,)),
                     "strategy": (None, ("token",)), "dynamic": (None, (True,))}
_FP8_WEIGHTS = {**_INT8_WEIGHTS, "type": (None, ("float",))}
_FP8_ACTIVATIONS = {"num_bits": (None, (8,)), "type": (None, ("float",)), "dynamic": (None, (True,))}


def _int_quantized(group: Mapping[str, Any], path: str) -> QuantizationScheme:
    _eight_bit(group, path, _INT8_WEIGHTS, _INT8_ACTIVATIONS)
    return QuantizationScheme("compressed-tensors", INT8, "int-quantized")


def _float_quantized(group: Mapping[str, Any], path: str) -> QuantizationScheme:
    _eight_bit(group, path, _FP8_WEIGHTS, _FP8_ACTIVATIONS)
    return QuantizationScheme("compressed-tensors", FP8, "float-quantized")


def _eight_bit(group: Mapping[str, Any], path: str, weights: Mapping[str, tuple[Any, Sequence[Any]]],
               activations: Mapping[str, tuple[Any, Sequence[Any]]]) -> None:
    for key, rules in (("weights", weights), ("input_activations", activations)):
        if key == "input_activations" and group.get(key) is None:
            continue
        args = _arguments(group, path, key)
        for field, (default, served) in rules.items():
            _expect(args, f"{path}.{key}", field, default, served)
