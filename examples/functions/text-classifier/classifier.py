"""The example function's handler: texts in, a label and its probability out.

`load` reads model.safetensors and classifier.json from the package folder; `predict`
classifies the whole batch in one forward pass (this is where dynamic batching pays:
one call costs about the same for 1 text as for 32).
"""
from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

WORD = re.compile(r"[a-z']+")


def bucket_ids(text: str, buckets: int) -> list[int]:
    """Each word hashed (crc32, stable across processes) into one of `buckets`."""
    return [zlib.crc32(w.encode()) % buckets for w in WORD.findall(text.lower())] or [0]


class Model(torch.nn.Module):
    def __init__(self, buckets: int, dim: int, hidden: int, layers: int, labels: int):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(buckets, dim, mode="mean")
        blocks: list[torch.nn.Module] = [torch.nn.Linear(dim, hidden), torch.nn.GELU()]
        for _ in range(layers - 1):
            blocks += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
        self.mlp = torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, labels))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # ids: [total words], offsets: [B] -> logits [B, labels]
        return self.mlp(self.embed(ids, offsets))


def batch_tensors(texts: list[str], buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [bucket_ids(t, buckets) for t in texts]
    offsets = [0]
    for row in ids[:-1]:
        offsets.append(offsets[-1] + len(row))
    return torch.tensor([i for row in ids for i in row]), torch.tensor(offsets)


class TextClassifier:
    def load(self, model_dir: str) -> None:
        folder = Path(model_dir)
        self.config = json.loads((folder / "classifier.json").read_text())
        c = self.config
        self.model = Model(c["buckets"], c["dim"], c["hidden"], c["layers"], len(c["labels"]))
        self.model.load_state_dict(load_file(str(folder / "model.safetensors")))
        self.model.eval()
        torch.set_num_threads(1)

    def predict(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        texts = [str(item.get("text", "")) for item in inputs]
        with torch.inference_mode():
            probs = torch.softmax(self.model(*batch_tensors(texts, self.config["buckets"])), -1)
        labels = self.config["labels"]
        best = probs.argmax(-1).tolist()
        return [{"label": labels[b], "score": round(float(p[b]), 6)} for b, p in zip(best, probs)]
