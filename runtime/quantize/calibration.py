"""Calibration sequences: token ids [S, L] from text the model is later NOT evaluated on.

The default text is the docstrings of thawpool's own Python modules (ast.get_docstring
of every module, class and function in the packages beside runtime/): English technical
prose, held apart from the README and docs/*.md that benchmarks/quant_methods.py
measures perplexity on.
"""
from __future__ import annotations

import ast
from pathlib import Path

import torch

PACKAGES = ("runtime", "kernels", "spec", "wire", "pool", "controlplane")
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def default_text(root: Path = SOURCE_ROOT) -> str:
    """Every docstring of the packages' modules, in path order."""
    docs: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        docs.append(doc)
    return "\n\n".join(docs)


def sequences(ids: list[int], count: int, length: int) -> torch.Tensor:
    """`count` runs of `length` consecutive ids spread evenly over `ids` (fewer when the
    text holds fewer); ValueError when it holds none."""
    available = len(ids) // length
    if available == 0:
        raise ValueError(f"calibration: {len(ids)} tokens, fewer than one sequence of {length}")
    count = min(count, available)
    starts = [(j * available // count) * length for j in range(count)]
    return torch.tensor([ids[s:s + length] for s in starts], dtype=torch.long)
