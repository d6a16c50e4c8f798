"""The CUDA-graph decode path's pure parts (runtime/engine/cuda_graphs.py) and its option's
limits; the graphs themselves run in `make gpu-check` (cuda_graphs_decode)."""
from __future__ import annotations

import pytest

from runtime.core.config import EngineConfig
from runtime.engine.cuda_graphs import CAPTURE_SIZES, capture_sizes, graph_batch_size, require_capturable


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
        require_capturable(backend)
    require_capturable("triton")
