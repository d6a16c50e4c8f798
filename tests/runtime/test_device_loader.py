"""runtime/load/device.py: how tensors are cut into staged pieces and dealt to workers
(pure); the copy itself where there is a CUDA device."""
import pytest
import torch

from runtime.load.device import deal, plan_pieces


def test_pieces_cover_every_byte_once_and_none_is_over_the_stage():
    for nbytes in (0, 1, 31, 32, 33, 100):
        pieces = plan_pieces(nbytes, 32)
        assert all(0 < length <= 32 for _, length in pieces)
        covered = [b for offset, length in pieces for b in range(offset, offset + length)]
        assert covered == list(range(nbytes))


def test_a_stage_of_nothing_is_refused():
    with pytest.raises(ValueError):
        plan_pieces(10, 0)


def test_dealing_gives_every_tensor_to_one_worker_and_balances_the_bytes():
    sizes = [100, 7, 60, 60, 30, 1, 1, 45]
    dealt = deal(sizes, 3)
    assert sorted(i for share in dealt for i in share) == list(range(len(sizes)))
    loads = [sum(sizes[i] for i in share) for share in dealt]
    assert max(loads) - min(loads) <= max(sizes)
    assert deal(sizes, 1) == [sorted(range(len(sizes)), key=lambda i: -sizes[i])]
    assert deal([], 4) == [[], [], [], []]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the staged copy runs only there")
def test_streamed_weights_equal_their_host_bytes(tmp_path):
    from runtime.load.device import stream_to_device

    host = {"a": torch.randn(3000, 17), "b": torch.randn(5).to(torch.bfloat16), "empty": torch.empty(0)}
    moved_tensors, moved = stream_to_device(host, "cuda", torch.float32, threads=2, stage_bytes=4096)
    assert moved == sum(t.numel() * t.element_size() for t in host.values())
    for name, tensor in host.items():
        assert torch.equal(moved_tensors[name].cpu(), tensor.to(torch.float32))
