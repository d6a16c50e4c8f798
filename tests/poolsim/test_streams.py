"""Merging per-deployment chunks into one stream in time order."""
import types

import numpy as np

from poolsim.streams import Chunk, merge
from poolsim.workload import Request


def chunk(times, prompt=1):
    n = len(times)
    return Chunk(np.array(times, dtype=float), np.full(n, prompt, dtype=np.int64), np.arange(1, n + 1))


def test_requests_come_in_time_order_across_chunks_and_windows():
    a = iter([chunk([0.5, 61.0]), chunk([]), chunk([61.0, 200.0])])
    b = iter([chunk([0.1, 61.0, 119.9], prompt=2)])
    got = [(r.at_s, r.deployment, r.output_tokens) for r in merge(["a", "b"], [a, b], window_s=60.0)]
    assert got == [(0.1, "b", 1), (0.5, "a", 1), (61.0, "a", 2), (61.0, "a", 1), (61.0, "b", 2),
                   (119.9, "b", 3), (200.0, "a", 2)]


def test_ties_go_to_the_lower_deployment_whatever_the_window():
    def sources():
        return [iter([chunk([5.0, 5.0, 9.0])]), iter([chunk([5.0, 9.0])]), iter([chunk([1.0, 5.0])])]
    names = ["x", "y", "z"]
    streams = [list(merge(names, sources(), window_s=w)) for w in (0.5, 3.0, 60.0, 1e9)]
    assert all(s == streams[0] for s in streams)
    assert [(r.at_s, r.deployment) for r in streams[0]] == [
        (1.0, "z"), (5.0, "x"), (5.0, "x"), (5.0, "y"), (5.0, "z"), (9.0, "x"), (9.0, "y")]


def test_the_merge_is_lazy_and_yields_plain_requests():
    pulled = []

    def endless():
        for start in range(10 ** 9):
            pulled.append(start)
            yield chunk([start * 100.0, start * 100.0 + 1])
    stream = merge(["only"], [endless()])
    assert isinstance(stream, types.GeneratorType)
    first = next(stream)
    assert first == Request(0.0, "only", 1, 1) and type(first.at_s) is float and type(first.prompt_tokens) is int
    assert len(pulled) <= 2


def test_no_sources_or_empty_sources_give_nothing():
    assert list(merge([], [])) == []
    assert list(merge(["a"], [iter([chunk([])])])) == []
