"""Model folders and the transformers oracle for the engine tests."""
from __future__ import annotations

import pytest

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# Phi-4-mini's rope: LongRoPE (short factors up to 128 positions, long beyond) on the first
# 3/4 of each head; 6 factors for a rotary dim of 12
PHI4_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
             "original_max_position_embeddings": 128,
             "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5], "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]}
PHI4_SHORT_CONTEXT = 128    # a replica within the original context: short factors, as transformers

# name -> ModelSpec fields; each covers one thing the decoder must get right
ARCH_SPECS = {
    "llama_gqa": dict(arch="llama"),
    "llama3_rope": dict(arch="llama", rope_scaling=LLAMA3_ROPE),
    "mistral": dict(arch="mistral", max_shard_size="100KB"),    # sharded checkpoint too
    "qwen2_tied_bias": dict(arch="qwen2"),
    "mistral_sliding": dict(arch="mistral", config={"sliding_window": 16}),   # blocks freed behind it
    "qwen3": dict(arch="qwen3"),                                 # q/k norms
    "qwen3_moe": dict(arch="qwen3_moe", config={"mlp_only_layers": [1]}),    # one dense layer too
    "mixtral": dict(arch="mixtral"),                             # top-2 of 8 experts
    "gemma2": dict(arch="gemma2"),                # soft caps, window 16 then global, sandwich norms
    "gemma3": dict(arch="gemma3", config={"rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    "phi3_sliding": dict(arch="phi3", config={"sliding_window": 16}),   # Phi-3-mini-4k's window
    "phi4_mini": dict(arch="phi3", tie_word_embeddings=True,
                      config={"rope_parameters": PHI4_ROPE, "max_position_embeddings": 512,
                              "original_max_position_embeddings": 128}),
}
# engine options a spec is served with by the shared exactness tests. Where every layer
# slides, blocks behind the window are freed: a smaller cache still forces a preemption.
SLIDING_CACHE = dict(kv_cache_tokens=104)
ARCH_ENGINE = {"phi4_mini": dict(max_model_len=PHI4_SHORT_CONTEXT),
               "mistral_sliding": SLIDING_CACHE, "phi3_sliding": SLIDING_CACHE}


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
    """transformers greedy tokens and per-step log_softmax of its logits: n tokens, EOS
    among them like any other (min_new_tokens would mask it, where ignore_eos does not)."""
    import torch

    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                         eos_token_id=model.config.vocab_size,     # an id no step can pick
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]
    return tokens, logprobs
