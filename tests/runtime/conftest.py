"""Model folders and the transformers oracle for the engine tests."""
from __future__ import annotations

import pytest

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# name -> ModelSpec fields; each covers one thing the decoder must get right
ARCH_SPECS = {
    "llama_gqa": dict(arch="llama"),
    "llama3_rope": dict(arch="llama", rope_scaling=LLAMA3_ROPE),
    "mistral": dict(arch="mistral", max_shard_size="100KB"),    # sharded checkpoint too
    "qwen2_tied_bias": dict(arch="qwen2"),
}


@pytest.fixture(scope="session")
def arch_model(model_factory):
    """name in ARCH_SPECS -> model folder (built once per session)."""
    return lambda name: model_factory(**ARCH_SPECS[name])


@pytest.fixture(scope="session", autouse=True)
def _few_threads():
    import torch
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def hf_oracle():
    """path -> transformers model loaded from the same folder (cached)."""
    import torch
    import transformers

    loaded = {}

    def get(path):
        if path not in loaded:
            loaded[path] = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32).eval()
        return loaded[path]

    return get


def hf_greedy(model, prompt: list[int], n: int):
    """transformers greedy tokens and per-step log_softmax of its logits."""
    import torch

    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]
    return tokens, logprobs
