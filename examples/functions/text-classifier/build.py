"""Build the example function's weights: `python build.py [OUT_DIR] [--hidden N] [--layers N]` (default:
here, hidden 256; benchmarks/dynamic_batching.py builds a wider one, whose forward pass
costs what a real model's does).

Trains the classifier in classifier.py for a few seconds on sentences made from two
word lists (seeded: the same weights every run), writes classifier.json and
model.safetensors, and copies thawpool.toml and classifier.py next to them, so
OUT_DIR is a whole package to upload.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from classifier import Model, batch_tensors  # noqa: E402

CONFIG = {"buckets": 2048, "dim": 64, "hidden": 256, "layers": 3,
          "labels": ["negative", "positive"]}
POSITIVE = "good great excellent love wonderful happy superb fantastic delightful pleasant".split()
NEGATIVE = "bad awful terrible hate horrible sad poor dreadful boring nasty".split()
FILLER = "the a movie food service was it this really quite very and".split()


def sentences(rng: random.Random, n: int) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    for _ in range(n):
        label = rng.randrange(2)
        words = rng.sample(POSITIVE if label else NEGATIVE, 2) + rng.sample(FILLER, 4)
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def train(config: dict, steps: int = 60) -> Model:
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Model(config["buckets"], config["dim"], config["hidden"], config["layers"],
                  len(config["labels"]))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        texts, labels = sentences(rng, 64)
        loss = torch.nn.functional.cross_entropy(model(*batch_tensors(texts, config["buckets"])),
                                                 torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def build(out: Path, hidden: int = CONFIG["hidden"], steps: int = 60,
          layers: int = CONFIG["layers"]) -> Path:
    """steps=0: untrained weights (labels are noise; a load test needs only the cost)."""
    out.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, "hidden": hidden, "layers": layers}
    model = train(config, steps)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    (out / "classifier.json").write_text(json.dumps(config, indent=2))
    if out.resolve() != HERE:
        for name in ("thawpool.toml", "classifier.py"):
            shutil.copy(HERE / name, out / name)
    return out


if __name__ == "__main__":
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("out", nargs="?", type=Path, default=HERE)
    args.add_argument("--hidden", type=int, default=CONFIG["hidden"])
    args.add_argument("--layers", type=int, default=CONFIG["layers"])
    args.add_argument("--steps", type=int, default=60)
    parsed = args.parse_args()
    print(build(parsed.out, parsed.hidden, parsed.steps, parsed.layers))
