"""task "embed": pooled hidden states against transformers' on the same folder, alone and
batched with chunked prefill; the pooler on hand-made states."""
from __future__ import annotations

import pytest
import torch

from runtime import LLM
from runtime.engine.pooling import Pooler
from runtime.engine.scheduler import ScheduledChunk
from tests.runtime.exactness import prompts
from wire.sampling import SamplingParams

LENGTHS = [5, 41, 17, 64, 9, 30]


def hf_embedding(hf, prompt: list[int], pooling: str) -> torch.Tensor:
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), output_hidden_states=True)
    states = out.hidden_states[-1][0]          # after the final norm: last_hidden_state
    pooled = states[-1] if pooling == "last" else states.mean(0)
    return torch.nn.functional.normalize(pooled, dim=-1)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_equal_transformers_pooled_states(tiny_model, hf_oracle, pooling):
    torch.set_num_threads(1)
    batch = prompts(3, LENGTHS)
    # a token budget of 24: the long prompts come in chunks, several prompts per step
    llm = LLM(str(tiny_model), task="embed", pooling=pooling, kv_cache_tokens=72, block_size=8,
              max_num_batched_tokens=24, max_num_seqs=4)
    got = llm.embed(batch)
    hf = hf_oracle(str(tiny_model))
    for prompt, vector in zip(batch, got):
        torch.testing.assert_close(torch.tensor(vector), hf_embedding(hf, prompt, pooling),
                                   atol=1e-4, rtol=1e-4)
        assert abs(torch.tensor(vector).norm().item() - 1.0) < 1e-5
    assert llm.engine.block_manager.num_used_blocks == 0
    assert llm.embed([batch[0]])[0] == got[0]        # alone or batched: the same vector


def _chunk(request_id: str, n: int, start: int, last: bool) -> ScheduledChunk:
    return ScheduledChunk(request_id, [0] * n, start, [], last, SamplingParams())


def test_mean_pooling_sums_over_chunks_and_restarts_after_preemption():
    hidden = torch.arange(12, dtype=torch.float32).reshape(6, 2)    # rows [0,1] .. [10,11]
    pooler = Pooler("mean")
    assert pooler.pool(hidden[:4], [_chunk("a", 4, 0, False)]) == {}
    restarted = pooler.pool(hidden[2:4], [_chunk("a", 2, 0, False)])   # preempted: from 0
    assert restarted == {}
    done = pooler.pool(hidden[4:6], [_chunk("a", 2, 2, True)])
    mean = hidden[2:6].mean(0)
    assert torch.allclose(torch.tensor(done["a"]), mean / mean.norm())


def test_last_pooling_takes_the_final_row_of_the_last_chunk():
    hidden = torch.tensor([[3.0, 4.0], [0.0, 2.0], [6.0, 8.0]])
    out = Pooler("last").pool(hidden, [_chunk("a", 2, 0, True), _chunk("b", 1, 7, True)])
    assert out["a"] == [0.0, 1.0] and out["b"] == pytest.approx([0.6, 0.8])


def test_an_embedding_engine_refuses_speculation_and_unknown_pooling(tiny_model):
    with pytest.raises(ValueError, match="^pooling"):
        LLM(str(tiny_model), task="embed", pooling="max", kv_cache_tokens=64)
    with pytest.raises(ValueError, match="^task"):
        LLM(str(tiny_model), task="rerank", kv_cache_tokens=64)
