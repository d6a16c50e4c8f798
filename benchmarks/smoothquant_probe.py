"""W8A8 with SmoothQuant-style smoothing vs the outlier split: perplexity, emulated.

The probe that chose the engine's smoothing (runtime/load/smoothing.py, built after it: alpha
0.7, 1,024 random token ids); benchmarks/lowp_quality.py measures the engine itself.

Without smoothing, W8A8 keeps the 16 largest input channels of every call in fp32
(LLM.int8()'s split, kernels/int8.py), a pass that costs about as much as the int8 GEMM
itself. SmoothQuant (Xiao et al., 2023)
moves the activations' outliers into the weights instead: per input channel j of a
linear layer, s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha) from a calibration run,
X / s and W * s, and nothing is kept in fp32. This script emulates both in fp32 on
transformers' SmolLM2-135M-Instruct (hooks on every linear layer of the decoder blocks:
weights rounded to int8 per output channel, activations per token with a zero point,
through kernels/int8.py's own definitions) and prints perplexity on the held-out text of
benchmarks/quant_quality.py against fp32 measured in the same run.

The calibration is --calib-tokens tokens of this repository's runtime/*.py sources (code,
not the prose scored) or, with --calib random, random token ids: what a loader could use
with no data at hand.

    .venv/bin/python benchmarks/smoothquant_probe.py [--alphas 0.5 0.6 0.7 0.8] [--calib text|random]
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quant_quality import held_out_docs  # noqa: E402
from kernels import int8  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WINDOW = 256


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ppl-tokens", type=int, default=8192)
    p.add_argument("--calib-tokens", type=int, default=1024)
    p.add_argument("--calib", choices=["text", "random"], default="text")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8])
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


class Emulation:
    """Hooks on the decoder's linear layers: record max|x| per input channel, or quantize."""

    def __init__(self, model, torch) -> None:
        self.torch = torch
        self.layers = {n: m for n, m in model.named_modules()
                       if isinstance(m, torch.nn.Linear) and "layers." in n}
        self.weights = {n: m.weight.detach().clone() for n, m in self.layers.items()}
        self.amax: dict[str, object] = {}
        self.calibrating = False
        self.quantize = False
        self.outliers = 0
        self.smooth: dict[str, object] = {}
        for name, layer in self.layers.items():
            layer.register_forward_pre_hook(self._hook(name))

    def _hook(self, name: str):
        def pre(module, args):
            x = args[0]
            x2 = x.reshape(-1, x.shape[-1])
            if self.calibrating:
                seen = x2.abs().amax(dim=0)
                self.amax[name] = seen if name not in self.amax else self.torch.maximum(self.amax[name], seen)
                return None
            if not self.quantize:
                return None
            if name in self.smooth:
                x2 = x2 / self.smooth[name]
            return (self.per_token(x2).reshape(x.shape),)
        return pre

    def per_token(self, x2):
        """kernels/int8.py's W8A8 activations (its own functions), dequantized: `outliers`
        channels apart, the rest per token with a zero point."""
        inliers, apart, cols = int8.split_outliers(x2, self.outliers)
        xq, step, zero = int8.quantize_per_token(inliers)
        out = (xq.float() - zero[:, None].float()) * step[:, None]
        out[:, cols] = apart
        return out

    @staticmethod
    def int8_weight(w):
        return int8.dequantize(*int8.quantize_per_channel(w))

    def configure(self, alpha: Optional[float], outliers: int) -> None:
        """Weights int8 (smoothed first when alpha is given), activations quantized."""
        self.smooth = {}
        for name, layer in self.layers.items():
            w = self.weights[name]
            if alpha is not None:
                s = (self.amax[name].clamp_min(1e-5) ** alpha  # type: ignore[union-attr]
                     / w.abs().amax(dim=0).clamp_min(1e-5) ** (1 - alpha)).clamp_min(1e-5)
                self.smooth[name] = s
                w = w * s[None, :]
            layer.weight.data = self.int8_weight(w)
        self.quantize, self.outliers = True, outliers

    def restore(self) -> None:
        for name, layer in self.layers.items():
            layer.weight.data = self.weights[name].clone()
        self.quantize, self.smooth = False, {}


def perplexity(model, ids: list[int], torch) -> float:
    """Windows of WINDOW tokens, each scored from its second token on."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for begin in range(0, len(ids) - 1, WINDOW):
            x = torch.tensor([ids[begin:begin + WINDOW]])
            logp = torch.log_softmax(model(x).logits[0].float(), dim=-1)
            nll -= logp[torch.arange(x.shape[1] - 1), x[0, 1:]].sum().item()
            count += x.shape[1] - 1
    return math.exp(nll / count)


def calibration_ids(kind: str, count: int, tokenizer, vocab: int) -> list[int]:
    if kind == "random":
        rng = random.Random(0)
        return [rng.randrange(5, vocab) for _ in range(count)]
    text = "\n".join(p.read_text() for p in sorted((REPO / "runtime").glob("*.py")))
    ids: list[int] = tokenizer.encode(text)[:count]
    return ids


def main(argv: Optional[list[str]] = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scripts.real_model import smollm2_dir

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokenizer.encode(held_out_docs())[:args.ppl_tokens]
    emulation = Emulation(model, torch)
    emulation.calibrating = True
    calib = calibration_ids(args.calib, args.calib_tokens, tokenizer, model.config.vocab_size)
    with torch.no_grad():
        for begin in range(0, len(calib), WINDOW):
            model(torch.tensor([calib[begin:begin + WINDOW]]))
    emulation.calibrating = False
    fp32 = perplexity(model, ids, torch)
    print(f"SmolLM2-135M-Instruct, {len(ids)} held-out tokens, windows of {WINDOW}; calibration: "
          f"{len(calib)} tokens ({args.calib}); W8A8 emulated in fp32")
    print(f"  fp32                                  perplexity {fp32:.3f}")
    cases: list[tuple[str, Optional[float], int]] = [("no smoothing, no channel apart", None, 0),
                                                     ("no smoothing, 16 channels apart (the engine)", None, 16)]
    cases += [(f"smoothing alpha {a:g}, no channel apart", a, 0) for a in args.alphas]
    for label, alpha, outliers in cases:
        emulation.configure(alpha, outliers)
        ppl = perplexity(model, ids, torch)
        emulation.restore()
        print(f"  {label:44s} perplexity {ppl:.3f}  ({ppl / fp32 - 1:+.3%} vs fp32; issue 20's target: 1%)",
              flush=True)


if __name__ == "__main__":
    from benchmarks.results import recorded  # type: ignore[attr-defined]  # mypy: the folder results/

    with recorded(__file__):
        main()
