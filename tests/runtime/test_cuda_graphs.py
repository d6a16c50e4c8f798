"""The CUDA-graph decode path off the GPU (runtime/engine/cuda_graphs.py): the sizes
captured, which graph replays a batch and which batches run eagerly, the option's
refusals, and the step a graph records run eagerly on the CPU over the static buffers
(padding rows, stale rows, the rows returned) against the eager step. The graphs
themselves are captured and replayed in `make gpu-check` (cuda_graphs_decode)."""
from __future__ import annotations

import pytest
import torch

from runtime.core.config import EngineConfig
from runtime.engine.cuda_graphs import (CAPTURE_SIZES, DecodeGraphs, capture_sizes, graph_batch_size, replay_size,
                                        require_capturable)
from runtime.models.batch import DecodeMeta, ForwardBatch, PrefillMeta


def test_each_batch_runs_the_smallest_graph_that_holds_it():
    sizes = capture_sizes(48)
    assert sizes == (1, 2, 4, 8, 16, 24, 32, 48)
    assert [graph_batch_size(n, sizes) for n in (1, 2, 3, 5, 17, 24, 25, 48)] == [1, 2, 4, 8, 24, 24, 32, 48]
    assert graph_batch_size(49, sizes) is None and graph_batch_size(0, sizes) is None


def test_capture_sizes_end_at_max_num_seqs_or_the_largest():
    assert capture_sizes(1) == (1,)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 24)
    assert capture_sizes(10_000) == CAPTURE_SIZES


@pytest.mark.parametrize("device, tp", [("cpu", 1), ("cuda", 2)])
def test_graphs_need_a_gpu_and_one_rank(device, tp):
    config = EngineConfig(model="m", device=device, tensor_parallel_size=tp, cuda_graphs=True)
    with pytest.raises(ValueError, match="^cuda_graphs"):
        config.validate()
    EngineConfig(model="m", device="cuda:0", cuda_graphs=True).validate()


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_graphs_without_the_triton_kernels_are_refused_before_the_load(backend):
    """The reference decode attention reads block tables on the host: no graph can record it."""
    with pytest.raises(ValueError, match="cuda_graphs: needs the Triton kernels"):
        require_capturable(backend, experts=False)
    require_capturable("triton", experts=False)


def test_refused_for_a_mixture_of_experts_even_with_triton():
    """Its expert dispatch counts tokens on the host (kernels/moe.py), which a capture refuses."""
    with pytest.raises(ValueError, match="cuda_graphs: a mixture-of-experts model cannot be captured"):
        require_capturable("triton", experts=True)


def test_the_runner_refuses_before_it_reads_a_weight(tiny_model):
    """No Triton kernels (the CPU's set here): refused before the load, which would fail
    otherwise on the missing weights folder."""
    from runtime.core.config import ModelConfig
    from runtime.engine.model_runner import ModelRunner
    from runtime.load.timings import LoadTimings

    config = EngineConfig(model="/nonexistent/weights", device="cpu", cuda_graphs=True)   # not validated
    with pytest.raises(ValueError, match="cuda_graphs: needs the Triton kernels"):
        ModelRunner(ModelConfig.from_dir(tiny_model), config, LoadTimings())


# ---------------------------------------------------------------- which graph runs a batch

def _decode(rows: int, width: int = 2) -> DecodeMeta:
    return DecodeMeta(block_tables=torch.zeros(rows, width, dtype=torch.int32),
                      context_lens=torch.ones(rows, dtype=torch.int32))


def _batch(rows: int, decode: DecodeMeta | None, prefill: PrefillMeta | None = None) -> ForwardBatch:
    return ForwardBatch(positions=torch.zeros(rows, dtype=torch.long), slot_mapping=torch.zeros(rows, dtype=torch.long),
                        logits_indices=torch.arange(rows), prefill=prefill, decode=decode)


def test_which_graph_replays_a_batch_and_which_batches_run_eagerly():
    sizes, max_blocks = (1, 2, 4, 8), 4
    assert [replay_size(n, _batch(n, _decode(n)), sizes, max_blocks) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert replay_size(4, _batch(4, _decode(4, width=4)), sizes, max_blocks) == 4      # as wide as captured
    eager = {
        "more rows than the largest graph": replay_size(9, _batch(9, _decode(9)), sizes, max_blocks),
        "tables wider than captured": replay_size(2, _batch(2, _decode(2, width=5)), sizes, max_blocks),
        "a prefill in the batch": replay_size(3, _batch(3, _decode(1), PrefillMeta(2, [2], [2], None)),
                                              sizes, max_blocks),
        "no decode rows": replay_size(2, _batch(2, None, PrefillMeta(2, [2], [2], None)), sizes, max_blocks),
        "rows that are not one per sequence": replay_size(3, _batch(3, _decode(2)), sizes, max_blocks),
        "no rows": replay_size(0, _batch(0, _decode(0)), sizes, max_blocks),
    }
    assert eager == {why: None for why in eager}


# ---------------------------------------------------------------- the graphs' step, eagerly on the CPU

BLOCK, BLOCKS, MAX_BLOCKS = 4, 16, 4          # the scratch block is block 16


class _EagerGraph:
    """What a captured graph does on replay, run eagerly: the step over the static
    buffers, into the output buffer it was captured with."""

    def __init__(self, graphs: DecodeGraphs, size: int):
        self.graphs, self.size = graphs, size
        graphs.outputs[size] = graphs.step(size, graphs.static.batch(size))

    def replay(self) -> None:
        self.graphs.outputs[self.size].copy_(self.graphs.step(self.size, self.graphs.static.batch(self.size)))


@pytest.fixture(scope="module")
def model(tiny_model):
    from runtime.core.config import ModelConfig
    from runtime.load.timings import LoadTimings
    from runtime.models import model_class

    config = ModelConfig.from_dir(tiny_model)
    loaded = model_class(config.architecture)(config, torch.float32, "cpu")
    loaded.load(str(tiny_model), LoadTimings())
    return loaded


def _prefilled(model, prompts: list[list[int]], tables: list[list[int]]):
    """A KV cache (with the scratch block) holding each prompt at its blocks."""
    caches = model.allocate_kv_cache(BLOCKS + 1, BLOCK)
    lens = [len(p) for p in prompts]
    positions = torch.cat([torch.arange(n) for n in lens])
    slots = torch.tensor([t[p // BLOCK] * BLOCK + p % BLOCK for t, n in zip(tables, lens) for p in range(n)])
    batch = ForwardBatch(positions=positions, slot_mapping=slots, logits_indices=torch.tensor([len(positions) - 1]),
                         prefill=PrefillMeta(num_tokens=len(positions), query_lens=lens, context_lens=lens,
                                             block_tables=None))
    with torch.inference_mode():
        model.forward(torch.tensor([t for p in prompts for t in p]), batch, caches)
    return caches


def _decode_step(prompts: list[list[int]], tables: list[list[int]], tokens: list[int],
                 sampled: list[bool]) -> tuple[torch.Tensor, ForwardBatch]:
    """One token per sequence at the position after its prompt (a sequence that samples
    nothing is a one-token chunk of a prompt)."""
    pos = [len(p) for p in prompts]
    width = max(p // BLOCK + 1 for p in pos)
    rows = [t[:p // BLOCK + 1] + [0] * (width - p // BLOCK - 1) for t, p in zip(tables, pos)]
    batch = ForwardBatch(positions=torch.tensor(pos), slot_mapping=torch.tensor(
        [t[p // BLOCK] * BLOCK + p % BLOCK for t, p in zip(tables, pos)]),
        logits_indices=torch.tensor([i for i, s in enumerate(sampled) if s]),
        decode=DecodeMeta(block_tables=torch.tensor(rows, dtype=torch.int32),
                          context_lens=torch.tensor([p + 1 for p in pos], dtype=torch.int32)))
    return torch.tensor(tokens), batch


def _graphs(model, caches) -> DecodeGraphs:
    graphs = DecodeGraphs(model, caches, "cpu", (1, 2, 4, 8), max_blocks=MAX_BLOCKS, scratch_block=BLOCKS,
                          block_size=BLOCK)
    for size in graphs.sizes:
        graphs._pad(0, size)
        graphs.graphs[size] = _EagerGraph(graphs, size)
    return graphs


PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21]]
TABLES = [[0, 1], [2], [3, 4, 5]]


@pytest.mark.parametrize("sampled", [[True, True, True], [True, False, True]],
                         ids=["every-row-samples", "a-prompt-chunk-row-samples-nothing"])
def test_a_padded_graph_step_gives_the_eager_logits_and_cache(model, sampled):
    """A batch of 3 replays the graph of 4: its padding row decodes into the scratch block
    only; the rows it samples come back as the eager step's, in its order."""
    eager_caches, graph_caches = _prefilled(model, PROMPTS, TABLES), _prefilled(model, PROMPTS, TABLES)
    input_ids, batch = _decode_step(PROMPTS, TABLES, [30, 31, 32], sampled)
    with torch.inference_mode():
        eager = model.logits(model.forward(input_ids, batch, eager_caches))
        graphs = _graphs(model, graph_caches)
        graphed = graphs.run(input_ids, batch)
    assert graphed is not None and graphed.shape == eager.shape == (sum(sampled), model.config.vocab_size)
    torch.testing.assert_close(graphed, eager, rtol=1e-5, atol=1e-5)
    for (ek, ev), (gk, gv) in zip(eager_caches, graph_caches):
        torch.testing.assert_close(gk[:BLOCKS], ek[:BLOCKS], rtol=1e-5, atol=1e-6)    # the requests' blocks
        torch.testing.assert_close(gv[:BLOCKS], ev[:BLOCKS], rtol=1e-5, atol=1e-6)
        assert not ek[BLOCKS].any() and gk[BLOCKS, 0].any()   # padding wrote to the scratch block, slot 0
        assert not gk[BLOCKS, 1:].any()


def test_a_smaller_batch_after_a_larger_one_pads_the_rows_its_graph_reads(model):
    prompts, tables = [*PROMPTS, [22, 23]], [*TABLES, [6]]
    graphs = _graphs(model, _prefilled(model, prompts, tables))
    with torch.inference_mode():
        assert graphs.stage(*_decode_step(prompts, tables, [30, 31, 32, 33], [True] * 4)) == 4
        assert graphs.stage(*_decode_step(prompts[1:], tables[1:], [41, 42, 43], [True] * 3)) == 4
    s = graphs.static
    assert s.input_ids[:3].tolist() == [41, 42, 43] and s.positions[:3].tolist() == [3, 9, 2]
    assert s.lens[:3].tolist() == [4, 10, 3] and s.tables[1, :3].tolist() == [3, 4, 5]
    assert s.slots[:3].tolist() == [2 * BLOCK + 3, 5 * BLOCK + 1, 6 * BLOCK + 2]
    # row 3 held the first batch's fourth sequence: now a padding row
    assert (s.input_ids[3].item(), s.positions[3].item(), s.lens[3].item()) == (0, 0, 1)
    assert (s.slots[3].item(), s.tables[3, 0].item()) == (BLOCKS * BLOCK, BLOCKS)


def test_a_batch_no_graph_runs_is_not_staged(model):
    graphs = _graphs(model, _prefilled(model, PROMPTS, TABLES))
    before = [t.clone() for t in (graphs.static.input_ids, graphs.static.tables)]
    input_ids, batch = _decode_step(PROMPTS, TABLES, [30, 31, 32], [True] * 3)
    batch.prefill = PrefillMeta(num_tokens=0, query_lens=[], context_lens=[], block_tables=None)
    assert graphs.run(input_ids, batch) is None
    assert all(torch.equal(a, b) for a, b in zip(before, (graphs.static.input_ids, graphs.static.tables)))


@pytest.mark.parametrize("device, waits", [("cuda:0", ["cuda:0"]), ("cpu", [])])
def test_the_forward_time_on_cuda_waits_for_its_kernels(monkeypatch, device, waits):
    """forward_s counts a CUDA forward once its kernels have run, not once they are queued
    (a graph replay queues the whole step in microseconds)."""
    from types import SimpleNamespace

    from runtime.engine.model_runner import ModelRunner

    synchronized: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", synchronized.append)
    runner = SimpleNamespace(device=device, forward_s=0.0)
    ModelRunner._count_forward(runner, started=0.0)
    assert synchronized == waits and runner.forward_s > 0
