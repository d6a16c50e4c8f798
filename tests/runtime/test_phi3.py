"""Phi-3 / Phi-4-mini beyond the shared exactness tests (test_correctness.py serves them
within the original context): LongRoPE's two factor sets and partial rotary, against
transformers, and a replica whose context is past the original one."""
from __future__ import annotations

import torch

from runtime.core.config import ModelConfig
from runtime.models.rope import attention_factor, rope_inv_freq, rotary_dim
from tests.runtime.conftest import PHI4_SHORT_CONTEXT
from tests.runtime.exactness import check_single_prompt


def test_longrope_factors_and_scale_equal_transformers(arch_model, hf_oracle):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path = arch_model("phi4_mini")
    config = ModelConfig.from_dir(path)
    hf_rotary = hf_oracle(path).model.rotary_emb
    long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](hf_rotary.config, None, seq_len=PHI4_SHORT_CONTEXT + 1)
    assert rotary_dim(config) == 12                      # 3/4 of a 16-wide head
    assert torch.equal(rope_inv_freq(config, PHI4_SHORT_CONTEXT), hf_rotary.original_inv_freq)
    assert torch.equal(rope_inv_freq(config, 512), long_inv_freq)
    assert attention_factor(config) == hf_rotary.attention_scaling > 1.0


def test_a_prompt_past_the_original_context_matches_transformers(arch_model, hf_oracle):
    """A replica of context 512 rotates with the long factors, as transformers does a
    sequence longer than the original 128 positions."""
    path = arch_model("phi4_mini")
    check_single_prompt(path, hf_oracle(path), length=140, kv_cache_tokens=512)


def test_fused_weights_are_taken_whole_and_the_window_reaches_the_block_manager(arch_model):
    from runtime import LLM

    llm = LLM(str(arch_model("phi3_sliding")), kv_cache_tokens=64)
    qkv = llm.engine.runner.model.layers[0].qkv
    assert (qkv.to_dense() if qkv.is_mkldnn else qkv).shape == (64 + 2 * 32, 64)    # q, k, v rows
    assert llm.engine.model_config.layer_windows == (16, 16)
    assert llm.engine.block_manager.sliding_window == 16
