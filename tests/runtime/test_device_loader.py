"""runtime/load/device.py: how tensors are cut into staged pieces and dealt to workers
(pure), the staging loop over a CPU link that lands copies late, and the safetensors
fallback of a load; the CUDA copy itself where there is a CUDA device."""
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


class _Landing:
    """A copy that lands only when waited for (or when its link drains)."""

    def __init__(self, target: torch.Tensor, staged: torch.Tensor):
        self.target, self.staged, self.landed = target, staged, False

    def synchronize(self) -> None:
        if not self.landed:
            self.target.copy_(self.staged)
            self.landed = True


class DeferredLink:
    """A Link on the CPU whose copies read their staging buffer as late as a GPU's may:
    only when waited for. A buffer filled again before its copy was waited on would
    hand the copy the next piece's bytes."""

    def __init__(self):
        self.sent: list[_Landing] = []
        self.buffers: list[torch.Tensor] = []

    def staging(self, nbytes: int) -> torch.Tensor:
        self.buffers.append(torch.empty(nbytes, dtype=torch.uint8))
        return self.buffers[-1]

    def send(self, target: torch.Tensor, staged: torch.Tensor) -> _Landing:
        self.sent.append(_Landing(target, staged))
        return self.sent[-1]

    def drain(self) -> None:
        for copy in self.sent:
            copy.synchronize()


def _host_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"a": torch.randn(3000, 17, generator=gen), "b": torch.randn(5, generator=gen).to(torch.bfloat16),
            "c": torch.randn(40, 3, generator=gen).to(torch.float16).t(),     # not contiguous
            "empty": torch.empty(0), "scalar": torch.tensor(2.5)}


@pytest.mark.parametrize("threads, stage_bytes", [(1, 4096), (3, 100), (2, 1 << 20)])
def test_the_staging_loop_waits_for_a_buffer_before_filling_it_again(threads, stage_bytes):
    from runtime.load.device import stream_to_device

    host, links = _host_tensors(), []

    def open_link(device):
        assert device == "cpu"
        links.append(DeferredLink())
        return links[-1]

    moved_tensors, moved = stream_to_device(host, "cpu", torch.float32, threads=threads, stage_bytes=stage_bytes,
                                            open_link=open_link)
    assert moved == sum(t.numel() * t.element_size() for t in host.values())
    assert 1 <= len(links) <= threads and all(len(link.buffers) == 2 for link in links)
    assert all(b.numel() <= stage_bytes for link in links for b in link.buffers)
    for name, tensor in host.items():
        got = moved_tensors[name]
        assert (got.dtype, got.shape) == (torch.float32, tensor.shape)
        assert torch.equal(_bits(got), _bits(tensor.to(torch.float32))), name


def test_a_failed_copy_fails_the_whole_stream():
    from runtime.load.device import stream_to_device

    class Broken(DeferredLink):
        def send(self, target, staged):
            raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        stream_to_device(_host_tensors(), "cpu", torch.float32, threads=2, open_link=lambda device: Broken())


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(-1).view(torch.uint8)


def _rows_and_columns(name: str):
    from runtime.tensor_parallel.shards import Shard

    if name.endswith("q_proj.weight"):
        return Shard(0, 16, 48)
    if name.endswith("o_proj.weight"):
        return Shard(1, 8, 40)
    return None


@pytest.mark.parametrize("stored, dtype, shard_of", [
    ("float32", torch.float32, None),
    ("bfloat16", torch.float32, _rows_and_columns),      # converted after the read, sharded
    ("float32", torch.bfloat16, None),
], ids=["fp32", "bf16-to-fp32-sharded", "fp32-to-bf16"])
def test_the_safetensors_fallback_loads_what_the_mapped_load_does(model_factory, monkeypatch, caplog,
                                                                  stored, dtype, shard_of):
    """Where the staged loader fails (its first GPU run), a load reads with safetensors
    instead: the same tensors, bit for bit, dtype and shape, as the CPU's mapped load."""
    from runtime.load import weights

    model = model_factory(dtype=stored, max_shard_size="100KB")          # several files
    reference, _ = weights.mapped_weights(model, dtype, shard_of)

    def staged_fails(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(weights, "stream_to_device", staged_fails)
    with caplog.at_level("WARNING", logger="runtime.load.weights"):
        tensors, moved = weights._onto_device(model, dtype, "cpu", shard_of)
    assert "reading with safetensors instead" in caplog.text and "illegal memory access" in caplog.text
    assert len(list(model.glob("*.safetensors"))) > 1
    assert tensors.keys() == reference.keys()
    for name, tensor in tensors.items():
        want = reference[name]
        assert (tensor.dtype, tensor.shape, tensor.device.type) == (want.dtype, want.shape, "cpu"), name
        assert torch.equal(_bits(tensor), _bits(want)), name
    assert moved == sum(t.numel() * t.element_size() for t in reference.values())
    if shard_of is not None:
        assert tensors["model.layers.0.self_attn.q_proj.weight"].shape[0] == 32
        assert tensors["model.layers.0.self_attn.o_proj.weight"].shape[1] == 32


def test_the_staged_path_is_the_one_taken_when_it_works(model_factory, monkeypatch):
    """_onto_device streams the mapped views (no fallback) when the staged copy succeeds."""
    from runtime.load import device, weights

    model = model_factory()
    monkeypatch.setattr(weights, "stream_to_device",
                        lambda views, dev, dtype, **kw: device.stream_to_device(
                            views, dev, dtype, open_link=lambda _: DeferredLink(), **kw))
    monkeypatch.setattr(weights, "iter_weights", lambda *a, **k: pytest.fail("fell back"))
    tensors, moved = weights._onto_device(model, torch.float32, "cpu", None)
    reference, _ = weights.mapped_weights(model, torch.float32)
    assert tensors.keys() == reference.keys() and all(torch.equal(tensors[k], reference[k]) for k in tensors)
    assert moved == sum(t.numel() * t.element_size() for t in reference.values())
