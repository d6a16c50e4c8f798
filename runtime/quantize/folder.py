"""A float model folder quantized into a Hugging Face quantized folder: the tokenized
calibration text, the method's quantizer over the layers, the writer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from runtime.core.tokenizer import Tokenizer
from runtime.quantize import awq, calibration, gptq, writers
from runtime.quantize.layers import LINEARS, FloatModel, LayerRunner, read_model

METHODS = ("gptq", "awq", "rtn")           # rtn: round-to-nearest on GPTQ's grids, written as GPTQ
LINEAR_SUFFIXES = tuple(f".{name}.weight" for name in LINEARS)


@dataclass(frozen=True)
class Options:
    method: str = "gptq"
    group: int = 128
    desc_act: bool = False                 # GPTQ: act_order
    sym: bool = False                      # GPTQ, RTN: symmetric grids
    clip: bool = True                      # AWQ: the clipping search
    samples: int = 32                      # calibration sequences
    seq_len: int = 256                     # tokens each


def quantize_folder(source: Path, out: Path, options: Options, text: Optional[str] = None) -> Path:
    """`out`, written; text: the calibration text (default: calibration.default_text())."""
    if options.method not in METHODS:
        raise ValueError(f"method: {options.method!r} is not one of {', '.join(METHODS)}")
    model = read_model(source)
    _check_groups(model, options.group)
    runner = None
    if options.method != "rtn":
        ids = Tokenizer(source).encode(text if text is not None else calibration.default_text(),
                                       add_special_tokens=False)
        length = min(options.seq_len, model.config.max_position_embeddings)
        runner = LayerRunner(model.config, calibration.sequences(ids, options.samples, length))
    with torch.inference_mode():
        if options.method == "awq":
            assert runner is not None
            linears = awq.quantize_model(model, runner, options.group, clipping=options.clip)
            config = writers.awq_config(options.group)
            fmt = "awq"
        else:
            linears = gptq.quantize_model(model, runner, options.group, options.desc_act, options.sym)
            config = writers.gptq_config(options.group, options.desc_act, options.sym, gptq.DAMP,
                                         true_sequential=False)
            fmt = "gptq"
    return writers.write_folder(source, out, model.tensors, linears, fmt, config)


def _check_groups(model: FloatModel, group: int) -> None:
    """ValueError naming the first linear whose input width `group` does not divide: the
    formats' readers (the engine's among them) and AWQ take whole groups only."""
    for name, t in model.tensors.items():
        if name.endswith(LINEAR_SUFFIXES) and t.shape[1] % group:
            raise ValueError(f"group {group} does not divide the {t.shape[1]} inputs of {name}: "
                             "choose a group size that does")
