"""Builds the tensors for one scheduled batch, runs the model, samples.

All scheduled tokens go through one model call: prefill chunks first (varlen),
then one row per decoding sequence (batched paged attention). A decoding sequence
with speculative proposals is a small chunk of 1 + k tokens over its paged cache,
scored at every row and verified by runtime/spec_decode/rejection_sampler.py.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable, Optional, Protocol, TypeVar

import torch

from kernels.dispatch import get_kernels
from runtime.core.config import EngineConfig, ModelConfig
from runtime.engine.cpu_replay import DecodeReplays
from runtime.lora.adapter import LoraAdapter
from runtime.lora.weights import LoraWeights
from runtime.engine.cuda_graphs import DecodeGraphs, capture_sizes, require_capturable
from runtime.engine.pooling import Pooler
from runtime.models.kv_memory import kv_cache_dtype
from runtime.load.timings import LoadTimings
from runtime.load.weights import DTYPES
from runtime.models import model_class
from runtime.models.batch import DecodeMeta, ForwardBatch, PrefillMeta
from runtime.load.packed_weights import PackedWeightCache
from runtime.load.packed_weights import available as packed_weights_available
from runtime.spec_decode.rejection_sampler import speculative_verify
from runtime.engine.sampler import Sampler
from runtime.engine.structured_output import PendingMasks, StructuredOutputs
from runtime.engine.scheduler import RunnerOutput, ScheduledChunk, SchedulerOutput
from runtime.core.sleep_mode import Freed
from runtime.tensor_parallel.shards import TensorParallel
from runtime.tensor_parallel.worker_group import WorkerGroup

log = logging.getLogger(__name__)

T = TypeVar("T")


class DecodeReplay(Protocol):
    """CUDA graphs or CPU replays of the decode step: the logits of a batch it can run,
    None for one the runner must run eagerly."""

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> Optional[torch.Tensor]: ...


class ModelRunner:
    """tp: this runner's rank; workers: on rank 0 of a tensor-parallel replica, the other
    ranks, which every model call is mirrored to (runtime/tensor_parallel/worker_group.py)."""

    def __init__(self, model_config: ModelConfig, config: EngineConfig, timings: LoadTimings,
                 tp: Optional[TensorParallel] = None, workers: Optional[WorkerGroup] = None):
        self.config = config
        self.tp = tp = tp or TensorParallel()      # a single rank unless given
        self.workers = workers
        self.device = tp.device(config.device)
        self.block_size = config.block_size
        if tp.size > 1:
            since = time.perf_counter()
            tp.connect(self.device)           # waits for every rank to be up
            timings.record("tp_connect", since)
        self.max_len = config.max_model_len or model_config.max_position_embeddings
        since = time.perf_counter()
        kernels = get_kernels(self.device)  # built or loaded once per process; the model asks again
        timings.record("kernels", since)
        if config.cuda_graphs:
            require_capturable(kernels.backend, experts=model_config.moe is not None)
        self.model = model_class(model_config.architecture)(
            model_config, DTYPES[config.dtype], self.device, quantization=config.quantization, tp=tp,
            context_len=self.max_len, batch_invariant=config.batch_invariant,
            low_precision=config.cpu_low_precision)
        self.model.load(config.model, timings, self._packed_cache())
        if config.max_loras:
            if model_config.moe is not None:
                raise ValueError("max_loras: adapters on a mixture-of-experts model are not supported")
            self.model.lora = LoraWeights(model_config, config.max_loras, config.max_lora_rank, self.device)
        since = time.perf_counter()
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, DTYPES[config.dtype])
        self.num_blocks = self._num_blocks(model_config)
        self.kv_caches = self._allocate_kv_cache()
        timings.record("kv_cache", since)
        self.graphs = self._capture_graphs()
        self.sampler = Sampler(self.device, config.seed)
        self.pooler = Pooler(config.pooling) if config.task == "embed" else None
        self.structured: Optional[StructuredOutputs] = None   # the engine's, when it has one
        self.forward_s = 0.0                  # time inside the model forward (incl. logits)
        self.offload = weight_offload(self.device)   # how weights leave the device in sleep

    def _allocate_kv_cache(self) -> list:
        """The paged KV cache: the block manager's blocks, then (CUDA graphs) one scratch
        block the padding rows of a graph write into, never handed out."""
        scratch = 1 if self.config.cuda_graphs else 0
        return self.model.allocate_kv_cache(self.num_blocks + scratch, self.block_size, self.kv_dtype)

    def _capture_graphs(self) -> Optional[DecodeReplay]:
        """CUDA graphs where asked for; on the CPU, replays of recorded C kernel calls."""
        if not self.config.cuda_graphs:
            cpu = self.device == "cpu" and self.tp.size == 1 and self.model.ops.backend == "cpu"
            if not (cpu and self.config.cpu_replay):
                return None
            return DecodeReplays(self.model, self.kv_caches, max_blocks=-(-self.max_len // self.block_size),
                                 block_size=self.block_size)
        graphs = DecodeGraphs(self.model, self.kv_caches, self.device, capture_sizes(self.config.max_num_seqs),
                              max_blocks=-(-self.max_len // self.block_size), scratch_block=self.num_blocks,
                              block_size=self.block_size)
        graphs.capture()
        return graphs

    def _packed_cache(self) -> Optional[PackedWeightCache]:
        """The node's packed-layer cache, where there is one to use: packed layers are the
        CPU's (batch-invariant mode keeps its weights plain)."""
        config = self.config
        if config.packed_cache_dir is None or self.device != "cpu" or config.batch_invariant:
            return None
        if not packed_weights_available():
            log.warning("packed weights cache: this torch cannot rebuild packed tensors; packing each load")
            return None
        return PackedWeightCache(config.packed_cache_dir, int(config.packed_cache_gb * (1 << 30)))

    def _num_blocks(self, model_config: ModelConfig) -> int:
        if self.config.kv_cache_tokens is not None:
            return -(-self.config.kv_cache_tokens // self.block_size)
        per_block = self.model.kv_bytes_per_token(self.kv_dtype) * self.block_size
        budget = int(_free_memory(self.device) * self.config.kv_cache_memory_fraction)
        if not self.device.startswith("cuda"):
            budget = min(budget, self.config.kv_cache_max_bytes_cpu)
        useful = self.config.max_num_seqs * -(-self.max_len // self.block_size)   # more is never used
        return self.tp.min_int(max(1, min(budget // per_block, useful)), self.device)

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput) -> RunnerOutput:
        self.sampler.release(batch.finished)
        if self.structured is not None:
            self.structured.release(batch.finished)
        if batch.copies:
            self.copy_blocks(batch.copies)
        if not batch.chunks:
            return RunnerOutput()
        chunks = prefills_first(batch.chunks)
        if self.pooler is not None:
            return RunnerOutput(embeddings=self._embed(chunks, batch.finished))
        sampled = [c for c in chunks if c.sample]
        masks = self._start_masks(sampled)   # structured outputs: computed during the forward
        logits = self.compute_logits(chunks)
        if not any(c.draft_token_ids for c in sampled):
            return self._sample(logits, sampled, masks=masks)
        rows = _first_rows(sampled)
        plain = [i for i, c in enumerate(sampled) if not c.draft_token_ids]
        out = RunnerOutput()
        if plain:
            self._sample(logits[[rows[i] for i in plain]], [sampled[i] for i in plain], out, masks)
        for i, chunk in enumerate(sampled):
            if chunk.draft_token_ids:
                self._verify(logits[rows[i]:rows[i] + 1 + len(chunk.draft_token_ids)], chunk, out)
        return out

    @torch.inference_mode()
    def compute_hidden(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """Final hidden states [T, H] of every scheduled token, in chunk order (task "embed")."""
        def local() -> torch.Tensor:
            input_ids, fwd = self._prepare(chunks)
            every = torch.arange(len(input_ids), device=self.device)
            started = time.perf_counter()
            hidden = self.model.forward(input_ids, dataclasses.replace(fwd, logits_indices=every),
                                        self.kv_caches)
            self._count_forward(started)
            return hidden
        return self._on_every_rank(local, "compute_hidden", chunks)[0]

    def _embed(self, chunks: list[ScheduledChunk], finished: list[str]) -> dict[str, list[float]]:
        assert self.pooler is not None
        self.pooler.release(finished)
        return self.pooler.pool(self.compute_hidden(chunks), chunks)

    @torch.inference_mode()
    def compute_logits(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """Logits [rows, V] fp32 of every sampled chunk (1 + its proposals rows), in chunk order;
        chunks must come prefills first (see prefills_first)."""
        def local() -> torch.Tensor:
            input_ids, fwd = self._prepare(chunks)
            started = time.perf_counter()
            logits = self.graphs.run(input_ids, fwd) if self.graphs is not None else None
            if logits is None:
                logits = self.model.logits(self.model.forward(input_ids, fwd, self.kv_caches))
            self._count_forward(started)
            return logits
        return self._on_every_rank(local, "compute_logits", chunks)[0]

    def _count_forward(self, started: float) -> None:
        """The forward's seconds: on CUDA once its kernels have run, not once they are queued
        (the sampler waits for them next anyway, so the wait moves, it is not added)."""
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        self.forward_s += time.perf_counter() - started

    def weight_memory(self) -> list:
        """WeightMemory of each rank, rank 0 first (one entry without tensor parallelism)."""
        mine, theirs = self._on_every_rank(self.model.weight_memory, "weight_memory")
        return [mine, *(w[0] for w in theirs)]

    def _on_every_rank(self, local: Callable[[], T], method: str, *args: Any) -> tuple[T, list]:
        """Run `local` here and the same-named method on every worker (their collectives
        meet ours); returns our result and the workers' replies."""
        if self.workers is None:
            return local(), []
        self.workers.send(method, *args)
        try:
            result = local()
        except RuntimeError as exc:      # a collective whose peer died: name the worker
            raise self.workers.explain(exc) from exc
        return result, self.workers.collect()

    def sleep(self) -> Freed:
        """Free the KV cache and, on CUDA, move the weights to pinned host memory, on every
        rank (runtime/core/sleep_mode.py); what was freed, summed over the ranks."""
        def local() -> Freed:
            kv_bytes = sum(k.nbytes + v.nbytes for k, v in self.kv_caches)   # views of one tensor
            self.kv_caches, self.graphs = [], None
            weights = self.model.weight_memory().total_bytes
            if self.offload is None:
                return Freed(0, kv_bytes, weights)
            self.model.move_weights(self.offload.to_host)
            self.offload.release()
            return Freed(weights, kv_bytes, weights)
        mine, theirs = self._on_every_rank(local, "sleep")
        return sum(theirs, mine)

    def wake(self) -> LoadTimings:
        """Weights back on the device and a fresh KV cache, on every rank; rank 0's stages."""
        def local() -> LoadTimings:
            timings = LoadTimings()
            since = time.perf_counter()
            if self.offload is not None:
                self.model.move_weights(self.offload.to_device)
                self.offload.settle()
                timings.weight_bytes = self.model.weight_memory().total_bytes
            since = timings.record("weights", since)
            self.kv_caches = self._allocate_kv_cache()
            timings.record("kv_cache", since)
            self.graphs = self._capture_graphs()     # the weights and the cache moved
            return timings
        return self._on_every_rank(local, "wake")[0]

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
        self.tp.disconnect()

    @torch.inference_mode()
    def load_lora(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy an adapter's weights into a slot (the scheduler chose it: no running
        request uses the slot's previous adapter)."""
        assert self.model.lora is not None, "an engine without adapter slots placed an adapter"
        self.model.lora.load(slot, adapter)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked KV blocks (n > 1), on every rank: dst <- src, every layer."""
        def local() -> None:
            src = torch.tensor([s for s, _ in pairs], device=self.device)
            dst = torch.tensor([d for _, d in pairs], device=self.device)
            for k, v in self.kv_caches:
                k[dst] = k[src]
                v[dst] = v[src]
        self._on_every_rank(local, "copy_blocks", pairs)

    def _sample(self, logits: torch.Tensor, sampled: list[ScheduledChunk],
                out: Optional[RunnerOutput] = None, masks: Optional[PendingMasks] = None) -> RunnerOutput:
        """One token per chunk, and one per fork (n > 1) from its chunk's row; `masks`: the
        allowed tokens of the rows with a structured output."""
        out = RunnerOutput() if out is None else out
        rows, ids, params, histories = [], [], [], []
        for row, chunk in enumerate(sampled):
            for request_id, p in [(chunk.request_id, chunk.params), *chunk.forks]:
                rows.append(row)
                ids.append(request_id)
                params.append(p)
                histories.append(chunk.history)
        if len(rows) > len(sampled):
            logits = logits[rows]
        mask = masks.take([sampled[r].request_id for r in rows]) if masks is not None else None
        tokens, logprobs = self.sampler.sample(logits, ids, params, histories, mask)
        if mask is not None and self.structured is not None:
            self.structured.advance(ids, params, tokens)
        for request_id, token, lp in zip(ids, tokens, logprobs):
            out.token_ids[request_id] = [token]
            if lp is not None:
                out.logprobs[request_id] = [lp]
        return out

    def _start_masks(self, sampled: list[ScheduledChunk]) -> Optional[PendingMasks]:
        if self.structured is None or not any(c.params.structured_output for c in sampled):
            return None
        return self.structured.start([c.request_id for c in sampled], [c.params for c in sampled])

    def _verify(self, logits: torch.Tensor, chunk: ScheduledChunk, out: RunnerOutput) -> None:
        """logits [1 + k, V] of one sequence's last token and its k proposals."""
        gen = self.sampler.generator(chunk.request_id, chunk.params)
        tokens = speculative_verify(logits, chunk.draft_token_ids, chunk.draft_probs, chunk.params, gen)
        out.token_ids[chunk.request_id] = tokens
        if chunk.params.logprobs is not None:
            out.logprobs[chunk.request_id] = self.sampler.logprobs(
                logits[:len(tokens)], tokens, [chunk.params] * len(tokens))

    @torch.inference_mode()
    def prompt_logits(self, ids: list[int]) -> torch.Tensor:
        """[T, V] logits of every position of `ids`, scored as one fresh prefill.

        For evaluation (perplexity, teacher-forced agreement), outside the scheduler: it
        writes KV slots 0..T-1, so call it only on an engine that serves nothing else."""
        def local() -> torch.Tensor:
            n = len(ids)
            batch = ForwardBatch(positions=torch.arange(n, device=self.device),
                                 slot_mapping=torch.arange(n, device=self.device),
                                 logits_indices=torch.arange(n, device=self.device),
                                 prefill=PrefillMeta(num_tokens=n, query_lens=[n], context_lens=[n],
                                                     block_tables=None))
            hidden = self.model.forward(torch.tensor(ids, device=self.device), batch, self.kv_caches)
            return self.model.logits(hidden)
        return self._on_every_rank(local, "prompt_logits", ids)[0]

    def _prepare(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, ForwardBatch]:
        # batch-invariant: a token's attention always by the prefill kernel, read from the
        # cache, never by the decode kernel (another order of sums) or from fresh k and v
        invariant = self.config.batch_invariant
        prefills = chunks if invariant else [c for c in chunks if _num_rows(c) > 1]
        decodes = chunks[len(prefills):]
        ids, positions, slots = [], [], []
        for c in chunks:
            ids.extend(c.token_ids + c.draft_token_ids)
        prefill = self._prefill_meta(prefills, positions, slots, invariant) if prefills else None
        decode = self._decode_meta(decodes, positions, slots) if decodes else None
        ends, row = [], 0
        for c in chunks:
            row += _num_rows(c)
            if c.sample:
                ends.extend(range(row - 1 - len(c.draft_token_ids), row))
        dev = self.device
        adapters = [-1 if c.lora_slot is None else c.lora_slot for c in chunks for _ in range(_num_rows(c))]
        fwd = ForwardBatch(
            positions=torch.cat(positions).to(dev) if len(positions) > 1 else positions[0].to(dev),
            slot_mapping=torch.cat(slots).to(dev) if len(slots) > 1 else slots[0].to(dev),
            logits_indices=torch.tensor(ends, dtype=torch.long, device=dev),
            prefill=prefill, decode=decode,
            lora_slots=torch.tensor(adapters, dtype=torch.long, device=dev) if max(adapters) >= 0 else None)
        return torch.tensor(ids, dtype=torch.long, device=dev), fwd

    def _prefill_meta(self, chunks, positions: list, slots: list, paged: bool = False) -> PrefillMeta:
        bs = self.block_size
        q_lens = [_num_rows(c) for c in chunks]
        ctx_lens = [c.start + n for c, n in zip(chunks, q_lens)]
        tables = _padded([c.block_table[:-(-ctx // bs)] for c, ctx in zip(chunks, ctx_lens)])
        seq = torch.repeat_interleave(torch.arange(len(chunks)), torch.tensor(q_lens))
        starts = torch.tensor([c.start for c in chunks])
        offsets = torch.arange(len(seq)) - torch.repeat_interleave(
            torch.tensor([0] + q_lens[:-1]).cumsum(0), torch.tensor(q_lens))
        pos = starts[seq] + offsets
        positions.append(pos)
        slots.append(tables[seq, pos // bs].long() * bs + pos % bs)
        paged = paged or any(c.start > 0 for c in chunks)
        return PrefillMeta(num_tokens=len(seq), query_lens=q_lens, context_lens=ctx_lens,
                           block_tables=tables.to(self.device) if paged else None)

    def _decode_meta(self, chunks, positions: list, slots: list) -> DecodeMeta:
        bs = self.block_size
        pos = [c.start for c in chunks]
        positions.append(torch.tensor(pos, dtype=torch.long))
        slots.append(torch.tensor([c.block_table[p // bs] * bs + p % bs for c, p in zip(chunks, pos)],
                                  dtype=torch.long))
        tables = _padded([c.block_table[:p // bs + 1] for c, p in zip(chunks, pos)])
        return DecodeMeta(block_tables=tables.to(self.device),
                          context_lens=torch.tensor([p + 1 for p in pos], dtype=torch.int32,
                                                    device=self.device))


def prefills_first(chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
    return sorted(chunks, key=lambda c: _num_rows(c) == 1)


def _num_rows(chunk: ScheduledChunk) -> int:
    return len(chunk.token_ids) + len(chunk.draft_token_ids)


def _first_rows(sampled: list[ScheduledChunk]) -> list[int]:
    """Index of each sampled chunk's first logits row."""
    rows, row = [], 0
    for c in sampled:
        rows.append(row)
        row += 1 + len(c.draft_token_ids)
    return rows


def _padded(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)


@dataclasses.dataclass(frozen=True)
class WeightOffload:
    """How a sleeping runner's weights leave `device` and come back: to host memory,
    page-locked (`pin`) so that the way back runs at full bus speed."""
    device: str
    pin: bool

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin)
        return host.copy_(t)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=self.pin)

    def release(self) -> None:
        """The device's freed blocks back to the driver (torch's allocator keeps them)."""
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def settle(self) -> None:
        """Returns once every copy to the device has landed; the host copies, let go by
        then, go back to the OS (torch's pinned allocator would keep them, a model's worth
        of page-locked host memory held by a replica that is awake)."""
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            torch.accelerator.empty_host_cache()


def weight_offload(device: str) -> Optional[WeightOffload]:
    """CUDA: weights sleep in pinned host memory; None on the CPU, where they are in host
    memory already and stay where they are."""
    return WeightOffload(device, pin=True) if device.startswith("cuda") else None


def _free_memory(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
