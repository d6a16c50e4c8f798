"""Greedy tokens equal transformers token for token (fp32); top-5 logprobs within 1e-3
(tests/runtime/exactness.py), for a tiny model of every architecture (conftest.ARCH_SPECS);
what only one family has is tested in its own file (test_gemma.py, test_phi3.py, ...)."""
from __future__ import annotations

import pytest

from tests.runtime.conftest import ARCH_ENGINE, ARCH_SPECS
from tests.runtime.exactness import check_batch, check_single_prompt


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_single_prompt_matches_transformers(name, arch_model, hf_oracle):
    path = arch_model(name)
    check_single_prompt(path, hf_oracle(path), **ARCH_ENGINE.get(name, {}))


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_batch_with_chunking_and_preemption_matches_transformers(name, arch_model, hf_oracle):
    """Different lengths served together; a small cache and budget force chunks and preemption."""
    path = arch_model(name)
    check_batch(path, hf_oracle(path), **ARCH_ENGINE.get(name, {}))


@pytest.mark.parametrize("name", ["llama_gqa", "llama3_rope"])
def test_rope_frequencies_equal_transformers(name, arch_model, hf_oracle):
    import torch

    from runtime.core.config import ModelConfig
    from runtime.models.rope import rope_inv_freq

    path = arch_model(name)
    hf_rotary = hf_oracle(path).model.rotary_emb
    ours = rope_inv_freq(ModelConfig.from_dir(path))
    assert torch.equal(ours, hf_rotary.inv_freq.float())
    assert hf_rotary.attention_scaling == 1.0
