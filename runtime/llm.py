"""LLM: the offline API over the same LLMEngine the server runs."""
from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence, Union, cast

from runtime.core.detokenizer import IncrementalDetokenizer
from runtime.engine.llm_engine import LLMEngine
from runtime.engine.outputs import CompletionOutput, RequestOutput
from runtime.engine.request import sample_ids
from runtime.core.tokenizer import Tokenizer
from wire.sampling import SamplingParams

Prompt = Union[str, list[int]]


class LLM:
    def __init__(self, model: str, device: str = "cpu", dtype: str = "float32",
                 kv_cache_tokens: Optional[int] = None, enable_prefix_caching: bool = True,
                 speculative: Optional[dict[str, Any]] = None, quantization: Optional[str] = None,
                 tensor_parallel_size: int = 1, **engine_kwargs: Any):
        self.engine = LLMEngine(model, device=device, dtype=dtype, kv_cache_tokens=kv_cache_tokens,
                                enable_prefix_caching=enable_prefix_caching, speculative=speculative,
                                quantization=quantization, tensor_parallel_size=tensor_parallel_size,
                                **engine_kwargs)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel worker processes (nothing to do on one rank)."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 lora: Union[str, Sequence[Optional[str]], None] = None,
                 priority: Union[int, Sequence[int]] = 0) -> list[CompletionOutput]:
        """lora: the adapter (engine.add_lora's name) of every prompt, or one per prompt
        (None: the base model). priority: of every prompt, or one per prompt; under the
        "priority" scheduling policy the lower is admitted first (wire/priority.py's classes)."""
        prompts = _as_list(prompts)
        params_list = _params_for(prompts, params)
        loras = _per_prompt("lora", lora, prompts, one=lora is None or isinstance(lora, str))
        priorities = _per_prompt("priority", priority, prompts, one=isinstance(priority, int))
        jobs: dict[str, _Job] = {}
        for prompt, p, adapter, rank in zip(prompts, params_list, loras, priorities):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, ids, p, lora=adapter, priority=rank)
            for sample_id in sample_ids(request_id, p.n):   # n > 1: prompt i's j-th at i * n + j
                jobs[sample_id] = _Job(CompletionOutput(sample_id, ids), self._detokenizer(p))
        order = list(jobs)
        while self.engine.has_unfinished_requests():
            for delta in self.engine.step():
                self._absorb(jobs[delta.request_id], delta)
        return [jobs[i].finish(self.tokenizer) for i in order]

    def embed(self, prompts: Union[Prompt, Sequence[Prompt]]) -> list[list[float]]:
        """Pooled, normalized hidden states of each prompt (an engine with task="embed")."""
        if self.engine.config.task != "embed":
            raise ValueError("task: this engine generates; make it with task='embed'")
        outs = self.generate(prompts, SamplingParams(max_tokens=1))
        return [o.embedding or [] for o in outs]

    def _detokenizer(self, p: SamplingParams) -> Optional[IncrementalDetokenizer]:
        return IncrementalDetokenizer(self.tokenizer, p.stop) if p.stop else None

    def _absorb(self, job: "_Job", delta: RequestOutput) -> None:
        out = job.out
        out.token_ids.extend(delta.new_token_ids)
        out.num_cached_tokens = delta.num_cached_tokens
        out.embedding = delta.embedding or out.embedding
        if delta.new_logprobs is not None:
            out.logprobs = (out.logprobs or []) + delta.new_logprobs
        if job.detok is not None and not job.detok.stopped:
            job.detok.push(delta.new_token_ids)
            if job.detok.stopped:
                self.engine.abort_request(out.request_id)
                out.finish_reason = "stop"
        if delta.finished:
            if out.finish_reason is None:
                out.finish_reason = delta.finish_reason
            out.metrics = delta.metrics


class _Job:
    def __init__(self, out: CompletionOutput, detok: Optional[IncrementalDetokenizer]):
        self.out, self.detok = out, detok

    def finish(self, tokenizer: Tokenizer) -> CompletionOutput:
        if self.detok is not None:
            self.detok.flush()
            self.out.text = self.detok.text
        else:
            self.out.text = tokenizer.decode(self.out.token_ids)
        return self.out


def _per_prompt(name: str, given: Any, prompts: list[Prompt], one: bool) -> list[Any]:
    """`given` for every prompt (one value), or its list, one per prompt."""
    values = [given] * len(prompts) if one else list(given)
    if len(values) != len(prompts):
        raise ValueError(f"{name}: {len(values)} values for {len(prompts)} prompts")
    return values


def _as_list(prompts: Union[Prompt, Sequence[Prompt]]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and isinstance(items[0], int):
        return [cast(list[int], items)]   # one prompt of token ids
    return cast(list[Prompt], items)


def _params_for(prompts: list[Prompt], params: Union[SamplingParams, Sequence[SamplingParams], None]
                ) -> list[SamplingParams]:
    if params is None:
        params = SamplingParams()
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    given = list(params)
    if len(given) != len(prompts):
        raise ValueError(f"params: {len(given)} given for {len(prompts)} prompts")
    return given
