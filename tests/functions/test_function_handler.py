"""The handler contract and the batching loop, with real (small) handler classes."""
import asyncio

import pytest

from runtime.functions.batcher import Batcher
from runtime.functions.handler import HandlerError, run_batch
from runtime.functions.worker import FunctionWorker

pytestmark = pytest.mark.asyncio(loop_scope="function")


class Doubler:
    def __init__(self):
        self.calls: list[int] = []

    def load(self, model_dir):
        pass

    def predict(self, inputs):
        self.calls.append(len(inputs))
        if any("boom" in i for i in inputs):
            raise RuntimeError("boom")
        return [{"y": i["x"] * 2} for i in inputs]


class Broken:
    def __init__(self, answer):
        self.answer = answer

    def load(self, model_dir):
        pass

    def predict(self, inputs):
        return self.answer(inputs)


@pytest.mark.parametrize("answer, says", [
    (lambda xs: xs[:-1], "returned 1 results for 2 inputs"),
    (lambda xs: {"y": 1}, "returned dict, not a list"),
    (lambda xs: [{"y": 1}, "two"], "result 1 is str, not a dict"),
    (lambda xs: [{"y": float("nan")}] * 2, "not JSON"),
    (lambda xs: [{"y": object()}] * 2, "not JSON"),
])
async def test_a_broken_contract_fails_the_batch_never_a_mismatch(answer, says):
    with pytest.raises(HandlerError) as failed:
        run_batch(Broken(answer), [{"x": 1}, {"x": 2}])
    assert says in str(failed.value)


async def test_a_raising_handler_says_what_and_where():
    with pytest.raises(HandlerError) as failed:
        run_batch(Doubler(), [{"boom": 1}])
    assert "predict raised RuntimeError: boom (test_function_handler.py:" in str(failed.value)


async def test_concurrent_calls_share_one_predict_and_get_their_own_results():
    handler = Doubler()
    worker = FunctionWorker(lambda xs: run_batch(handler, xs), Batcher(4, max_wait_s=3600.0))
    worker.start()
    try:
        results = await asyncio.gather(worker.submit(({"x": 1},)), worker.submit(({"x": 2}, {"x": 3})),
                                       worker.submit(({"x": 4},)))
    finally:
        await worker.stop()
    assert handler.calls == [4]                      # full at 4 items: one predict
    assert [[r.output["y"] for r in rs] for rs in results] == [[2], [4, 6], [8]]
    assert {r.batch_size for rs in results for r in rs} == {4}


async def test_a_failed_batch_fails_only_its_own_calls():
    handler = Doubler()
    worker = FunctionWorker(lambda xs: run_batch(handler, xs), Batcher(2, max_wait_s=3600.0))
    worker.start()
    try:
        bad = await asyncio.gather(worker.submit(({"x": 1},)), worker.submit(({"boom": 1},)),
                                   return_exceptions=True)
        good = await asyncio.gather(worker.submit(({"x": 5},)), worker.submit(({"x": 6},)))
    finally:
        await worker.stop()
    assert all(isinstance(r, HandlerError) for r in bad)
    assert [rs[0].output["y"] for rs in good] == [10, 12]
    assert worker.stats.failed_batches == 1 and worker.stats.batches == 1
