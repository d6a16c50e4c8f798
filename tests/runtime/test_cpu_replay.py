"""CPU decode replays (runtime/engine/cpu_replay.py): a model whose layers are all C
kernel calls (4-bit GGUF weights) decodes the same tokens replayed as eagerly, at every
batch size a replay serves and past it; layers that compute with torch (fp32 weights go
through oneDNN) turn replays off; a replayed kernel's error is raised; sleep drops them."""
from __future__ import annotations

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.engine.cpu_replay import MAX_ROWS, ReplayFailed
from runtime.models.batch import DecodeMeta, ForwardBatch
from tests.runtime.test_speculative import _prompts

SPECS = {"llama": dict(arch="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
         "qwen2": dict(arch="qwen2", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False)}


@pytest.fixture(scope="module", params=sorted(SPECS))
def q4_folder(request, model_factory, tmp_path_factory):
    from runtime.gguf.importer import import_gguf
    from tests.support.gguf_files import write_model_gguf

    tmp = tmp_path_factory.mktemp(f"q4-{request.param}")
    write_model_gguf(tmp / "m.gguf", model_factory(**SPECS[request.param]), "Q4_1")
    return import_gguf(tmp / "m.gguf", tmp / "folder")


def _llm(folder, **options) -> LLM:
    return LLM(str(folder), block_size=8, kv_cache_tokens=4096, **options)


def _tokens(llm: LLM, prompts) -> list[list[int]]:
    """Each prompt's greedy tokens, the i-th up to 8 + 4i of them: the decode batch
    shrinks one sequence at a time, through every size a replay serves."""
    params = [SamplingParams(max_tokens=8 + 4 * i, temperature=0.0, ignore_eos=True) for i in range(len(prompts))]
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("max_num_seqs", [1, 3, MAX_ROWS + 4])
def test_replayed_decoding_gives_the_eager_tokens(q4_folder, max_num_seqs):
    prompts = _prompts(1, 12)
    eager = _tokens(_llm(q4_folder, cpu_replay=False, max_num_seqs=max_num_seqs), prompts)
    llm = _llm(q4_folder, max_num_seqs=max_num_seqs)
    assert _tokens(llm, prompts) == eager
    replays = llm.engine.runner.graphs
    assert replays is not None and replays.enabled
    assert replays.replayed > 0 and all(r.verified for r in replays.recorded.values())
    assert set(replays.recorded) == set(range(1, min(max_num_seqs, MAX_ROWS) + 1))


def test_layers_computing_with_torch_turn_replays_off(tiny_model):
    prompts = _prompts(2, 4)
    llm = _llm(tiny_model)
    assert _tokens(llm, prompts) == _tokens(_llm(tiny_model, cpu_replay=False), prompts)
    replays = llm.engine.runner.graphs
    assert replays is not None and not replays.enabled and replays.recorded == {} and replays.replayed == 0


def _decode_batch(slot: int, context_len: int, width: int = 1) -> tuple[torch.Tensor, ForwardBatch]:
    """One sequence decoding token 7, its table `width` blocks wide (all block 0)."""
    return torch.tensor([7]), ForwardBatch(
        positions=torch.tensor([context_len - 1]), slot_mapping=torch.tensor([slot]),
        logits_indices=torch.tensor([0]),
        decode=DecodeMeta(block_tables=torch.zeros(1, width, dtype=torch.int32),
                          context_lens=torch.tensor([context_len], dtype=torch.int32)))


def test_a_replayed_kernel_error_is_raised_and_bad_lengths_refused(q4_folder):
    llm = _llm(q4_folder, max_num_seqs=1)
    _tokens(llm, _prompts(3, 1))
    replays = llm.engine.runner.graphs
    assert replays is not None and replays.recorded[1].verified
    caches = [c.clone() for c in llm.engine.runner.kv_caches[0]]
    with torch.inference_mode():          # as the runner calls it
        with pytest.raises(ReplayFailed, match="write_kv_f32 returned -1"):
            replays.run(*_decode_batch(slot=10 ** 9, context_len=5))
        assert all(torch.equal(a, b) for a, b in zip(caches, llm.engine.runner.kv_caches[0]))
        too_long = replays.max_blocks * replays.block_size + 1
        with pytest.raises(ValueError, match="context_lens"):
            replays.run(*_decode_batch(slot=3, context_len=too_long, width=replays.max_blocks))
        assert replays.run(*_decode_batch(slot=3, context_len=5)) is not None


def test_sleep_drops_the_replays_and_wake_records_anew(q4_folder):
    llm = _llm(q4_folder, max_num_seqs=2)
    prompts = _prompts(4, 2)
    before = _tokens(llm, prompts)
    llm.engine.sleep()
    llm.engine.wake()
    assert llm.engine.runner.graphs.recorded == {}
    assert _tokens(llm, prompts) == before
    assert llm.engine.runner.graphs.replayed > 0
