"""kv_cache_dtype="bfloat16" on a tiny fp32 Llama: the cache is bf16, twice the tokens fit in
the same memory budget, attention reads k/v as the cache holds them (even in a fresh
prefill), greedy outputs stay those of the fp32 cache, and the server takes the flag."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.engine.llm_engine import LLMEngine
from runtime.serve.model_host import build_llm_engine
from runtime.serve.server import parse_settings

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
PROMPTS = [[7, 300, 41, 12, 99, 5, 250, 18, 61, 77, 400, 3, 9], [200, 201, 17, 44, 8] * 6, [450, 2, 31]]


def fp32_bytes_per_block(model_dir: Path, block_size: int) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim: int = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_rows: int = cfg["num_hidden_layers"] * cfg["num_key_value_heads"]   # per token, k or v
    return 2 * kv_rows * head_dim * 4 * block_size


def test_the_cache_is_bf16_and_twice_the_tokens_fit_the_same_budget(tiny_model: Path) -> None:
    budget = 10 * fp32_bytes_per_block(tiny_model, 8)
    engines = {dtype: LLMEngine(str(tiny_model), kv_cache_dtype=dtype, kv_cache_max_bytes_cpu=budget,
                                block_size=8, max_num_seqs=64)
               for dtype in ("auto", "bfloat16")}
    for dtype, want in (("auto", torch.float32), ("bfloat16", torch.bfloat16)):
        caches = engines[dtype].runner.kv_caches
        assert {t.dtype for kv in caches for t in kv} == {want}
        assert sum(k.nbytes + v.nbytes for k, v in caches) == budget
    assert engines["auto"].stats().kv_blocks_total == 10
    assert engines["bfloat16"].stats().kv_blocks_total == 20


def test_greedy_tokens_match_the_fp32_cache_and_logprobs_stay_close(tiny_model: Path) -> None:
    # 16-token chunks: later chunks and every decode step read earlier k/v from the cache
    outs = {dtype: LLM(str(tiny_model), kv_cache_dtype=dtype, kv_cache_tokens=256, block_size=8,
                       max_num_batched_tokens=16).generate(PROMPTS, GREEDY)
            for dtype in ("auto", "bfloat16")}
    full, half = outs["auto"], outs["bfloat16"]
    assert [o.token_ids for o in half] == [o.token_ids for o in full]
    chosen = {dtype: torch.tensor([lp[0] for o in outs[dtype] for lp in o.logprobs]) for dtype in outs}
    assert not torch.equal(chosen["bfloat16"], chosen["auto"]), "the bf16 cache changed nothing"
    torch.testing.assert_close(chosen["bfloat16"], chosen["auto"], rtol=0, atol=0.02)


def test_a_fresh_prefill_attends_to_k_and_v_as_the_cache_holds_them(tiny_model: Path) -> None:
    # nothing cached: the prompt's own k/v are rounded to bf16 before attention too, so a
    # prompt scores the same whether its prefix was fresh, in an earlier chunk or cached
    engines = {dtype: LLMEngine(str(tiny_model), kv_cache_dtype=dtype, kv_cache_tokens=64)
               for dtype in ("auto", "bfloat16")}
    logits = {dtype: e.runner.prompt_logits(PROMPTS[0]) for dtype, e in engines.items()}
    assert not torch.equal(logits["bfloat16"], logits["auto"])
    torch.testing.assert_close(logits["bfloat16"], logits["auto"], rtol=0, atol=0.02)


def test_the_server_flag_reaches_the_cache(tiny_model: Path) -> None:
    settings = parse_settings(["--model", str(tiny_model), "--kv-cache-dtype", "bfloat16",
                               "--kv-cache-tokens", "64"], env={})
    engine, _ = build_llm_engine(settings.load_request())     # as the server loads its model
    try:
        assert engine.runner.kv_caches[0][0].dtype == torch.bfloat16
        engine.add_request("a", PROMPTS[2], GREEDY)
        tokens = []
        while engine.has_unfinished_requests():
            tokens += [t for out in engine.step() for t in out.new_token_ids]
    finally:
        engine.close()
    assert len(tokens) == GREEDY.max_tokens


def test_an_unknown_cache_dtype_is_refused_by_name(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLMEngine(str(tiny_model), kv_cache_dtype="float8")
