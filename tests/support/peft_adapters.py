"""Random PEFT LoRA adapters of a model folder, and transformers + peft's greedy tokens with
one applied: the oracle of the adapter tests, offline (tests/runtime/test_lora.py) and
served (tests/runtime_server/test_adapters.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from tests.runtime.conftest import hf_greedy

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def hf_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


def make_adapter(base: Path, folder: Path, rank: int, targets: list[str], seed: int) -> Path:
    """A random adapter as PEFT saves it: A and B both random (init_lora_weights=False),
    so its delta is far from zero, and alpha twice the rank."""
    import peft
    import torch

    torch.manual_seed(seed)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0,
                             init_lora_weights=False)
    peft.get_peft_model(hf_model(base), config).save_pretrained(folder)
    return folder


def peft_greedy(base: Path, adapter: Optional[Path], prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy tokens with peft applying `adapter` (None: the base alone)."""
    import peft
    import torch

    model = hf_model(base)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        return hf_greedy(model, prompt, new_tokens)[0]
