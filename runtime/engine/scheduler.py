"""Continuous batching over the paged KV cache (pure Python, no torch, no clock).

Every step: running requests first (best first: oldest first under `fcfs`), each
gets the tokens it still needs (1 when decoding, a chunk when its prefill is split),
within a per-step token budget; if blocks run out, the worst running request is
preempted (its blocks freed, recomputed later). Then, if nothing was preempted,
waiting requests are admitted in order, reusing cached prefix blocks, while budget,
sequence slots and blocks last. The order is the policy's (runtime/engine/serve_order.py:
arrival, or priority then arrival); under `priority` a waiting request that finds no
room first preempts a running one of a strictly worse class. The scheduler and the
model runner exchange the plain dataclasses below.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from runtime.engine.block_manager import BlockManager
from runtime.engine.outputs import RequestOutput
from runtime.engine.request import History, Request, RequestStatus
from runtime.engine.serve_order import ServeOrder
from runtime.lora.slots import AdapterSlots
from wire.responses import TokenLogprobs
from wire.sampling import SamplingParams


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048          # prompt + output tokens of one request
    num_lookahead_slots: int = 0       # extra slots a decoding sequence holds (speculative proposals)
    max_loras: int = 0                 # adapter slots: distinct adapters among the running requests
    policy: str = "fcfs"               # or "priority": runtime/engine/serve_order.py


@dataclass
class ScheduledChunk:
    """Compute token_ids at positions start.. of one request; sample after it if `sample`."""
    request_id: str
    token_ids: list[int]
    start: int
    block_table: list[int]
    sample: bool
    params: SamplingParams
    draft_token_ids: list[int] = field(default_factory=list)   # proposals to verify after token_ids
    draft_probs: Optional[Any] = None    # their proposer's distributions [k, V]; None: one-hot
    history: Optional[History] = None    # for the logits processors (runtime/engine/penalties.py)
    # n > 1, the prompt's last chunk: the other samples, drawn from the same logits row
    forks: list[tuple[str, SamplingParams]] = field(default_factory=list)
    lora_slot: Optional[int] = None      # the adapter slot its rows use; None: the base model


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)    # gone since the last step: drop their state
    copies: list[tuple[int, int]] = field(default_factory=list)   # KV blocks (src, dst) to copy first
    lora_loads: list[tuple[int, str]] = field(default_factory=list)   # adapters (slot, name) to load first

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


@dataclass
class RunnerOutput:
    """What the model runner returns for each chunk with sample=True: the new tokens (one
    per step without speculation; accepted drafts + a bonus token with it) and their logprobs."""
    token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    embeddings: dict[str, list[float]] = field(default_factory=dict)   # task "embed", instead


@dataclass
class SchedulerStats:
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.blocks = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.stats = SchedulerStats()
        self._gone: list[str] = []
        self._pending: dict[str, Request] = {}    # sample id -> its leader, until forked
        self._copies: list[tuple[int, int]] = []
        self.adapters = AdapterSlots(config.max_loras)
        self.order = ServeOrder(config.policy)

    # ---- admission and cancellation
    def check_fits(self, num_prompt_tokens: int) -> None:
        """Refuse up front what could never run, even alone."""
        limit = self.config.max_model_len
        if num_prompt_tokens >= limit:
            raise ValueError(f"prompt: {num_prompt_tokens} tokens do not fit the context of "
                             f"{limit} tokens (leave room for at least one generated token)")
        if self.blocks.blocks_needed(num_prompt_tokens + 1) > self.blocks.num_blocks:
            raise ValueError(f"prompt: {num_prompt_tokens} tokens exceed the whole KV cache of "
                             f"{self.blocks.num_blocks * self.blocks.block_size} tokens")

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already in the engine")
        self.check_fits(request.num_prompt_tokens)
        self.requests[request.request_id] = request
        self._pending.update((sample.request_id, request) for sample in request.samples)
        self.order.arrive(self.waiting, request)

    def holds(self, request_id: str) -> bool:
        return request_id in self.requests or request_id in self._pending

    def unfinished_ids(self) -> list[str]:
        """The requests, and the samples not yet forked from them."""
        return [*self.requests, *self._pending]

    def abort(self, request_id: str, now: float) -> Optional[Request]:
        """The request ended (None if unknown). A leader's unforked samples end with it,
        found in its `samples`; an unforked sample just leaves its leader's list."""
        if request_id in self._pending:
            return self._drop_sample(request_id, now)
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self._finish(request, "abort", now)
        for sample in request.samples:      # never forked: they end with it
            self._pending.pop(sample.request_id, None)
            sample.status, sample.finish_reason, sample.finish_time = RequestStatus.FINISHED, "abort", now
        return request

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # ---- one step
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput(finished=self._gone, copies=self._copies)
        self._gone, self._copies = [], []
        budget = self.config.max_num_batched_tokens
        ahead, behind = self._split_running()
        budget, starved = self._schedule_running(out, budget, ahead)
        if behind and not starved:
            budget, starved = self._serve_better_class(out, budget, behind, now)
        if not starved:                          # blocks ran out for running requests: admit none
            self._schedule_waiting(out, budget, now)
        return out

    def _split_running(self) -> tuple[list[Request], list[Request]]:
        """The running requests ranked at or above the first waiting one, and those of a
        strictly worse class after them (none under `fcfs`, or when all rank alike)."""
        cut = self.order.ahead_of(self.running, self.waiting[0]) if self.waiting else len(self.running)
        return self.running[:cut], self.running[cut:]

    def _serve_better_class(self, out: SchedulerOutput, budget: int, behind: list[Request],
                            now: float) -> tuple[int, bool]:
        """`priority`: the waiting requests of a better class than `behind` are admitted
        before it, the worst of `behind` preempted while the first finds no room. A step
        that admits one runs none of `behind`: the better class's first token waits for
        its own prefill only (on a compute-bound device the worse class's decodes would
        lengthen that step); `behind` runs again from the next step."""
        worse = self.order.rank(behind[0])
        while behind and not self._room_for(self.waiting[0]):
            victim = behind.pop()                # the running list's last: its worst
            self.running.remove(victim)
            self._preempt(victim)
            out.preempted.append(victim.request_id)
        chunks = len(out.chunks)
        budget = self._schedule_waiting(out, budget, now, better_than=worse)
        if len(out.chunks) > chunks:
            return budget, False
        return self._schedule_running(out, budget, behind)

    def _room_for(self, request: Request) -> bool:
        """Whether a sequence slot and the blocks of its first chunk are free for `request`."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        cached = self.blocks.cached_prefix(request.token_ids, request.cache_salt)
        num_cached = len(cached) * self.blocks.block_size
        n = min(request.num_tokens - num_cached, self.config.max_num_batched_tokens)
        return self.blocks.can_allocate(cached, num_cached + n)

    def _schedule_running(self, out: SchedulerOutput, budget: int,
                          requests: list[Request]) -> tuple[int, bool]:
        """A chunk for each of `requests` (running, best first) within the budget; True
        with the budget left when blocks ran out and running requests were preempted."""
        preempted = len(out.preempted)
        for request in requests:
            if budget <= 0:
                break
            if request.status is not RequestStatus.RUNNING:   # preempted for an earlier one
                continue
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._make_room(request, self._slots_needed(request, n), out):
                break
            out.chunks.append(self._chunk(request, n))
            budget -= n
        return budget, len(out.preempted) > preempted

    def _slots_needed(self, request: Request, n: int) -> int:
        """The chunk's slots, plus the lookahead slots when it ends the sequence (decoding)."""
        end = request.num_computed_tokens + n
        if end < request.num_tokens:
            return end
        return min(end + self.config.num_lookahead_slots, self.config.max_model_len)

    def _make_room(self, request: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Preempt the worst running requests (the list's last: newest under `fcfs`) until
        `request` can hold num_tokens tokens."""
        while not self.blocks.can_append(request.request_id, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim.request_id)
            if victim is request:
                return False
        self.blocks.append_slot(request.request_id, num_tokens)
        return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float,
                          better_than: Optional[int] = None) -> int:
        """Admit in the policy's order (only those ranked better than `better_than` when it
        is given), while budget, slots and blocks last; the budget left. A request whose
        adapter finds no slot (every one held by running requests of other adapters) is
        passed over, and keeps its place."""
        passed: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if better_than is not None and self.order.rank(request) >= better_than:
                break
            if not self._place_adapter(request, out):
                passed.append(self.waiting.popleft())
                continue
            cached = self.blocks.cached_prefix(request.token_ids, request.cache_salt)
            num_cached = len(cached) * self.blocks.block_size
            n = min(request.num_tokens - num_cached, budget)
            if not self.blocks.can_allocate(cached, num_cached + n):
                break
            self.waiting.popleft()
            self.blocks.allocate(request.request_id, cached, num_cached + n, request.cache_salt)
            self._admit(request, num_cached, now)
            out.chunks.append(self._chunk(request, n))
            budget -= n
        self.waiting.extendleft(reversed(passed))
        return budget

    def _place_adapter(self, request: Request, out: SchedulerOutput) -> bool:
        if request.lora is None:
            return True
        placed = self.adapters.place(request.lora)
        if placed is None:
            return False
        slot, load = placed
        if load:
            out.lora_loads.append((slot, request.lora))
        return True

    def _pin(self, request: Request) -> None:
        if request.lora is not None:
            self.adapters.pin(request.lora)

    def _unpin(self, request: Request) -> None:
        if request.lora is not None:
            self.adapters.unpin(request.lora)

    def _admit(self, request: Request, num_cached: int, now: float) -> None:
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_cached
        if request.num_cached_tokens is None:    # first admission; a resumed request keeps it
            request.num_cached_tokens = num_cached
            request.first_scheduled_time = now
            self.stats.prefix_cache_queries += request.num_prompt_tokens
            self.stats.prefix_cache_hits += num_cached
        self.order.admit(self.running, request)
        self._pin(request)

    def _preempt(self, request: Request) -> None:
        self.blocks.deallocate(request.request_id)
        self._unpin(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.order.requeue(self.waiting, request)

    def _chunk(self, request: Request, n: int) -> ScheduledChunk:
        start = request.num_computed_tokens
        sample = start + n == request.num_tokens
        return ScheduledChunk(
            request_id=request.request_id,
            token_ids=request.token_ids[start:start + n],
            start=start,
            block_table=self.blocks.block_table(request.request_id),
            sample=sample,
            params=request.params,
            history=History(request.token_ids, request.num_prompt_tokens, request.eos_token_ids)
            if request.params.processes_logits else None,
            forks=[(s.request_id, s.params) for s in request.samples] if sample else [],
            lora_slot=self.adapters.slot_of[request.lora] if request.lora is not None else None,
        )

    # ---- after the forward pass
    def postprocess(self, out: SchedulerOutput, result: RunnerOutput, now: float) -> list[RequestOutput]:
        deltas = []
        for chunk in out.chunks:
            request = self.requests.get(chunk.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += len(chunk.token_ids)
            self.blocks.commit(request.request_id, request.token_ids, request.num_computed_tokens)
            if chunk.sample and chunk.request_id in result.embeddings:
                deltas.append(self._pooled(request, result.embeddings[chunk.request_id], now))
            elif chunk.sample:
                deltas += self._fork(request, result, now)
                deltas.append(self._append_tokens(request, result, now))
                self._commit_verified(request)
        return deltas

    def _pooled(self, request: Request, embedding: list[float], now: float) -> RequestOutput:
        """An embedding request ends when its prompt is computed: no token is sampled."""
        request.first_token_time = now
        self._finish(request, "stop", now)
        return RequestOutput(request_id=request.request_id, new_token_ids=[], finished=True,
                             finish_reason="stop", num_prompt_tokens=request.num_prompt_tokens,
                             num_cached_tokens=request.num_cached_tokens or 0,
                             metrics=request.metrics(), embedding=embedding)

    def _fork(self, leader: Request, result: RunnerOutput, now: float) -> list[RequestOutput]:
        """n > 1, the prompt just computed: each other sample takes its first token (drawn
        from the same logits) and shares the prompt's blocks. Without a block for the copy
        of the partial last block it waits instead, and recomputes from the prefix cache."""
        deltas = []
        for sample in leader.samples:
            del self._pending[sample.request_id]
            self.requests[sample.request_id] = sample
            sample.num_cached_tokens = leader.num_cached_tokens
            sample.first_scheduled_time = leader.first_scheduled_time
            deltas.append(self._append_tokens(sample, result, now))
            if not sample.finished:
                self._place_fork(leader, sample)
        leader.samples = []
        return deltas

    def _place_fork(self, leader: Request, sample: Request) -> None:
        computed = leader.num_computed_tokens
        if not self.blocks.can_fork(computed):
            self.order.requeue(self.waiting, sample)
            return
        copy = self.blocks.fork(leader.request_id, sample.request_id, computed)
        if copy is not None:
            self._copies.append(copy)
        sample.status = RequestStatus.RUNNING
        sample.num_computed_tokens = computed
        self.order.admit(self.running, sample)
        self._pin(sample)

    def _drop_sample(self, sample_id: str, now: float) -> Request:
        leader = self._pending.pop(sample_id)
        sample = next(s for s in leader.samples if s.request_id == sample_id)
        leader.samples.remove(sample)
        sample.status, sample.finish_reason, sample.finish_time = RequestStatus.FINISHED, "abort", now
        return sample

    def _commit_verified(self, request: Request) -> None:
        """Every token but the newest has its k/v computed now: several were proposals the runner
        verified in the same pass. Rejected proposals are past this count and never hashed."""
        if request.status is RequestStatus.RUNNING and request.num_computed_tokens < request.num_tokens - 1:
            request.num_computed_tokens = request.num_tokens - 1
            self.blocks.commit(request.request_id, request.token_ids, request.num_computed_tokens)

    def _append_tokens(self, request: Request, result: RunnerOutput, now: float) -> RequestOutput:
        tokens = result.token_ids[request.request_id]
        logprobs = result.logprobs.get(request.request_id)
        if request.first_token_time is None:
            request.first_token_time = now
        reason, kept = None, 0
        for token in tokens:              # stop at the first token that ends the request
            request.token_ids.append(token)
            kept += 1
            reason = self._finish_reason(request, token)
            if reason is not None:
                self._finish(request, reason, now)
                break
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=tokens[:kept],
            new_logprobs=logprobs[:kept] if logprobs is not None else None,
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens or 0,
            metrics=request.metrics() if reason is not None else None,
        )

    def _finish_reason(self, request: Request, token: int) -> Optional[str]:
        params = request.params
        if not params.ignore_eos and token in request.eos_token_ids:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if request.num_output_tokens >= params.max_tokens:
            return "length"
        if request.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(self, request: Request, reason: str, now: float) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.blocks.deallocate(request.request_id)
            self._unpin(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = now
        del self.requests[request.request_id]
        self._gone.append(request.request_id)
