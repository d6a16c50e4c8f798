"""Model code, one module per family of checkpoints, sharing runtime/models/decoder.py:

- decoder.py:   DecoderModel (embedding, layers, final norm, logits, KV cache), LayerWeights
- attention.py: paged self-attention (optional q/k norm, bias, sliding window, soft cap)
- mlp.py:       GatedMLP (SwiGLU, GeGLU) and SparseMoE
- rope.py:      rotary embeddings (default, linear, llama3, longrope; partial rotary)
- batch.py:     ForwardBatch, what a model reads about one step
- llama.py (Llama, Mistral, Qwen2, Qwen3), gemma.py (Gemma 2, Gemma 3), phi3.py (Phi-3,
  Phi-4-mini), mixtral.py (Mixtral, Qwen3-MoE): how each reads its checkpoint.

Which class serves which architecture is spec/architectures.py. This package's
__init__ imports no torch; model_class() imports the one module it names.
"""
from __future__ import annotations

import importlib
from typing import Any

from spec.architectures import ARCHITECTURES


def import_all() -> None:
    """Every family's module: a warm standby does not yet know which one its load needs."""
    for module in sorted({spec.model.split(":")[0] for spec in ARCHITECTURES.values()}):
        importlib.import_module(f"runtime.models.{module}")


def model_class(architecture: str) -> Any:
    """The DecoderModel subclass that serves `architecture` (a name config.py accepted)."""
    module, name = ARCHITECTURES[architecture].model.split(":")
    return getattr(importlib.import_module(f"runtime.models.{module}"), name)
