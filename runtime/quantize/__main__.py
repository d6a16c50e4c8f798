"""python -m runtime.quantize --method gptq|awq|rtn [--group 128] [--desc-act] [--sym]
       [--no-clip] [--calibration FILE] [--samples N] [--seq-len L] MODEL_DIR OUT_DIR

Quantizes a float model folder (Llama, Mistral, Qwen2, Qwen3) to 4 bits and writes a
GPTQ (gptq, rtn) or AWQ (awq) folder the engine serves. Calibration text: FILE, or the
docstrings of thawpool's own modules (runtime/quantize/calibration.py)."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from runtime.quantize.folder import METHODS, Options, quantize_folder


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.quantize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--group", type=int, choices=(32, 64, 128), default=128)
    p.add_argument("--desc-act", action="store_true", help="GPTQ: columns by decreasing Hessian diagonal")
    p.add_argument("--sym", action="store_true", help="GPTQ, RTN: symmetric grids (zero 8)")
    p.add_argument("--no-clip", action="store_true", help="AWQ: skip the clipping search")
    p.add_argument("--calibration", type=Path, default=None, help="a text file")
    p.add_argument("--samples", type=int, default=Options.samples)
    p.add_argument("--seq-len", type=int, default=Options.seq_len)
    args = p.parse_args(argv)
    if args.desc_act and args.method != "gptq":
        p.error("--desc-act: GPTQ only")
    options = Options(args.method, args.group, args.desc_act, args.sym, not args.no_clip, args.samples, args.seq_len)
    text = args.calibration.read_text() if args.calibration is not None else None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    try:
        out = quantize_folder(args.model_dir, args.out_dir, options, text)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{out}: {args.method}, group {args.group}, in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
