"""LLMEngine: one replica's engine loop, shared by LLM.generate (in the caller's process)
and the server, which runs it in its engine-core process (runtime/serve/engine_core.py).

step() is three calls: scheduler.schedule() -> model_runner.run(batch) ->
scheduler.postprocess(batch, result). Options (speculative decoding, quantization,
tensor parallelism) enter through `check_features`, the model runner and the
speculator, never as flags inside the scheduler, so schedule() stays one policy.
"""
from __future__ import annotations

import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Optional

from spec.architectures import check_engine_options
from spec.engine_options import parse as parse_options
from runtime.engine.block_manager import BlockManager
from runtime.core.config import EngineConfig, ModelConfig
from runtime.load.timings import LoadTimings
from runtime.engine.outputs import EngineStats, RequestOutput
from runtime.engine.request import Request, sample_requests
from runtime.engine.scheduler import Scheduler, SchedulerConfig
from runtime.core.sleep_mode import Freed, NotIdle
from runtime.spec_decode.speculator import SpeculativeConfig, Speculator, make_speculator
from runtime.engine.structured_output import StructuredOutputs
from runtime.tensor_parallel.shards import check_divisible
from runtime.core.tokenizer import Tokenizer, eos_token_ids
from wire.sampling import SamplingParams, validate_prompt_ids

if TYPE_CHECKING:
    from runtime.engine.model_runner import ModelRunner
    from runtime.lora.adapter import LoraAdapter


def check_plain_sampling(params: SamplingParams) -> None:
    """Speculative verification samples from the raw logits, one sequence per request."""
    if params.n > 1:
        raise ValueError("n: n > 1 is not supported with speculative decoding")
    if params.processor_in_use is not None:
        raise ValueError(f"{params.processor_in_use}: penalties, logit_bias, min_p and "
                         "min_tokens are not supported with speculative decoding")


def _aborted(request: Request) -> RequestOutput:
    return RequestOutput(
        request_id=request.request_id, new_token_ids=[], finished=True, finish_reason="abort",
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens or 0, metrics=request.metrics())


def check_features(config: EngineConfig) -> None:
    """Refuse what this build cannot do yet, clearly, before any weights are read."""
    if config.speculative is not None:
        SpeculativeConfig.parse(config.speculative)      # ValueError naming what is wrong


class LLMEngine:
    """on_worker_failure(reason): called from a watchdog thread when a tensor-parallel
    worker dies (the server exits there); without it the next step raises WorkerDied."""

    def __init__(self, model: str, on_worker_failure: Optional[Callable[[str], None]] = None,
                 **engine_kwargs: Any):
        self.config = EngineConfig.of(str(model), parse_options(engine_kwargs))
        check_features(self.config)
        timings = LoadTimings()
        since = time.perf_counter()
        self.model_config = ModelConfig.from_dir(model)
        check_engine_options(self.model_config.architecture, self.config.tensor_parallel_size,
                             self.config.quantization, self.config.max_loras)
        check_divisible(self.model_config, self.config.tensor_parallel_size)
        # the engine needs only the tokenizer's eos ids; the tokenizer itself is parsed by
        # whoever turns text into ids: the server, beside this load, or `tokenizer` below
        self._eos = eos_token_ids(model, self.model_config.eos_token_ids)
        since = timings.record("config", since)
        # torch is imported here, not before
        from runtime.engine.model_runner import ModelRunner
        timings.record("import", since)
        self.runner = self._runner(ModelRunner, timings, on_worker_failure)
        self.load_record = timings                               # stages and weight bytes
        self.load_timings: dict[str, float] = timings.stages   # seconds per load stage
        # bytes on each rank's device, after any quantization; rank 0 first
        self.rank_weight_memory = self.runner.weight_memory()
        self.weight_memory = self.rank_weight_memory[0]
        self.max_model_len = min(self.config.max_model_len or self.model_config.max_position_embeddings,
                                 self.runner.num_blocks * self.config.block_size)
        # an embedding pools every prompt position: none may be skipped as cached
        prefix_caching = self.config.enable_prefix_caching and self.config.task == "generate"
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                          prefix_caching,
                                          sliding_window=self.model_config.kv_window)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            num_lookahead_slots=self._lookahead(), max_loras=self.config.max_loras,
            policy=self.config.scheduling_policy), self.block_manager)
        self.speculator: Optional[Speculator] = None
        if self.config.speculative is not None:
            self.speculator = make_speculator(self.config.speculative, self.config,
                                              self.max_model_len, self.runner.num_blocks)
        self.structured = self.runner.structured = StructuredOutputs(
            model, self.model_config.vocab_size, self._eos)
        self._aborts: list[str] = []   # applied at the start of the next step
        self.adapters: dict[str, LoraAdapter] = {}   # add_lora's, on the host
        self.step_s = 0.0          # wall time inside step()

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, parsed on first use (LLM, tests); the engine itself needs
        only its eos ids."""
        return Tokenizer(self.config.model, self.model_config.eos_token_ids)

    # Not thread-safe: only the thread that calls step() calls these (LLM.generate's, or
    # the engine core's CoreLoop). The requests it holds are the scheduler's `requests`.

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    cache_salt: Optional[str] = None, lora: Optional[str] = None,
                    priority: int = 0) -> None:
        """The one check of a request against the model; ValueError naming the field for
        token ids outside the vocabulary, bad parameters, a duplicate id, a prompt that
        could never run or an adapter the engine does not hold. The request joins the
        batch at the next step; `lora` names the adapter (add_lora) it runs with; `priority`
        orders it under the "priority" scheduling policy (lower first)."""
        validate_prompt_ids(prompt_token_ids, self.model_config.vocab_size)
        params.validate(self.model_config.vocab_size)
        self.structured.check(params)   # the grammar compiles for this tokenizer
        if self.config.speculative is not None:
            check_plain_sampling(params)
        salt = cache_salt if cache_salt is not None else self.config.cache_salt
        if lora is not None:
            self._check_lora(lora)
            # no KV is shared across adapters: each one's blocks hash apart
            salt = f"{salt or ''}\x00lora:{lora}"
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids),
                          params=params, arrival_time=time.monotonic(),
                          eos_token_ids=self._eos, cache_salt=salt, lora=lora, priority=priority)
        request.samples = sample_requests(request)   # n > 1: ids request_id/1 .. /n-1
        self.scheduler.add(request)

    # ---- adapters

    def add_lora(self, name: str, folder: str) -> None:
        """Hold the PEFT adapter in `folder` (host memory) under `name`; it moves into an
        adapter slot when a request for it is admitted. ValueError naming the field for an
        adapter the engine cannot apply (spec/lora_adapter.py) or a name taken."""
        self._check_slots(name)
        from runtime.lora.adapter import read_adapter    # torch's: imported after the weights load

        self.install_lora(read_adapter(name, folder, self.model_config, self.config.max_lora_rank))

    def install_lora(self, adapter: LoraAdapter) -> None:
        """Hold an adapter already read (read_adapter, adapter_from_bytes) under its name: a
        dict insert, no I/O, so the server's engine core runs it between two steps.
        ValueError when the engine has no adapter slots, the name is taken, or the rank is
        above the slots'."""
        self._check_slots(adapter.name)
        if adapter.rank > self.config.max_lora_rank:
            raise ValueError(f"r: rank {adapter.rank} is above this base's max_lora_rank "
                             f"({self.config.max_lora_rank})")
        self.adapters[adapter.name] = adapter

    def _check_slots(self, name: str) -> None:
        if not self.config.max_loras:
            raise ValueError("lora: this engine has no adapter slots (max_loras is 0)")
        if name in self.adapters:
            raise ValueError(f"lora: an adapter named {name!r} is already loaded")

    def remove_lora(self, name: str) -> None:
        """Let the adapter go; ValueError while a request the engine holds uses it."""
        if any(r.lora == name for r in self.scheduler.requests.values()) or not self.scheduler.adapters.forget(name):
            raise ValueError(f"lora: adapter {name!r} is in use by a request")
        self.adapters.pop(name, None)

    def _check_lora(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"lora: no adapter named {name!r} is loaded")

    def abort_request(self, request_id: str) -> None:
        """The request's blocks are freed, and its last output (finish_reason "abort") made,
        at the start of the next step; an id the engine does not hold is ignored."""
        if self.scheduler.holds(request_id):
            self._aborts.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def unfinished_request_ids(self) -> list[str]:
        return self.scheduler.unfinished_ids()

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        outputs = self._apply_aborts()
        batch = self.scheduler.schedule(time.monotonic())
        if batch.chunks or batch.finished:
            if self.speculator is not None:
                self.speculator.propose(batch, self.scheduler.requests)
            for slot, name in batch.lora_loads:
                self.runner.load_lora(slot, self.adapters[name])
            result = self.runner.run(batch)
            if self.speculator is not None:
                self.speculator.record(batch, result)
            outputs += self.scheduler.postprocess(batch, result, time.monotonic())
        elif self.scheduler.has_unfinished() and not outputs:
            raise RuntimeError("scheduler made no progress with requests pending")
        self.step_s += time.perf_counter() - started
        return outputs

    def _runner(self, runner_class: type[ModelRunner], timings: LoadTimings,
                on_worker_failure: Optional[Callable[[str], None]]) -> ModelRunner:
        """Rank 0's ModelRunner; with tensor parallelism its workers start first, so that
        they load their shards while this process loads its own."""
        if self.config.tensor_parallel_size == 1:
            return runner_class(self.model_config, self.config, timings)
        from runtime.tensor_parallel.worker_group import WorkerGroup

        workers = WorkerGroup(self.model_config, self.config)
        workers.on_failure = on_worker_failure
        try:
            return runner_class(self.model_config, self.config, timings, tp=workers.rank0(),
                                workers=workers)
        except BaseException:
            workers.close()
            raise

    def sleep(self) -> Freed:
        """Give the device back, keeping the weights in host memory (runtime/core/sleep_mode.py);
        NotIdle while any request is held."""
        if self.scheduler.has_unfinished() or self._aborts:
            raise NotIdle("requests are in flight")
        self.block_manager.drop_prefix_cache()
        freed = self.runner.sleep()
        return freed + self.speculator.proposer.sleep() if self.speculator is not None else freed

    def wake(self) -> LoadTimings:
        """The way back from sleep: weights on the device, a fresh KV cache; its stages."""
        timings = self.runner.wake()
        if self.speculator is not None:
            self.speculator.proposer.wake()
        return timings

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of tensor-parallel ranks 1..N-1 (empty on one rank)."""
        return self.runner.workers.pids if self.runner.workers is not None else []

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent)."""
        self.runner.close()

    def _lookahead(self) -> int:
        """Slots each decoding sequence holds beyond its next token, for proposals."""
        if self.config.speculative is None:
            return 0
        return SpeculativeConfig.parse(self.config.speculative).k

    def _apply_aborts(self) -> list[RequestOutput]:
        aborts, self._aborts = self._aborts, []
        outputs = []
        for request_id in aborts:
            request = self.scheduler.abort(request_id, time.monotonic())
            if request is not None:   # with its samples never forked, if any
                outputs += [_aborted(r) for r in [request, *request.samples] if r.finished]
        return outputs

    def stats(self) -> EngineStats:
        s = self.scheduler.stats
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_total=self.block_manager.num_blocks,
            kv_blocks_used=self.block_manager.num_used_blocks,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
            spec_proposed=self.speculator.num_proposed if self.speculator is not None else 0,
            spec_accepted=self.speculator.num_accepted if self.speculator is not None else 0,
            weight_bytes=self.weight_memory.total_bytes,
        )

    @property
    def forward_s(self) -> float:
        """Time inside the model forward (the rest of step_s is loop overhead)."""
        return self.runner.forward_s
